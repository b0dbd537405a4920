"""Each answer's max new tokens is declared once (``shared/limits.py``): every default that means one of them
equals it as a user sees it (the commands' options, the config fields, the functions' defaults), the GRPO phase
configs (YAML cannot import it) agree, and so does docs/training.md's table. A small-scale override is named as
one (``DEMO_MAX_TOKENS``, ``SMOKE_MAX_TOKENS``, ``LOOP_SMOKE_MAX_TOKENS``)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from services.reward_api.settings import Settings
from shared.limits import EVAL_ANSWER_MAX_TOKENS, SCHEMA_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS
from trainer.checks.preflight import advantage_check
from trainer.cli import app
from trainer.demo.settings import DEMO_MAX_TOKENS, DemoSettings
from trainer.evaluation.generation import GenerationConfig
from trainer.registry.phases import PHASES
from trainer.rft import RftConfig
from trainer.runs.config import ExperimentConfig, LoopConfig, RunConfig
from trainer.serving.reward_api import serve_reward_api
from trainer.smoke import grpo as smoke_grpo
from trainer.smoke.loop import LOOP_SMOKE_MAX_TOKENS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "trainer" / "phases" / "configs"
DOC = REPO / "docs" / "training.md"
KNOBS = {
    "SCHEMA_ANSWER_MAX_TOKENS": SCHEMA_ANSWER_MAX_TOKENS,
    "TABLE_ANSWER_MAX_TOKENS": TABLE_ANSWER_MAX_TOKENS,
    "EVAL_ANSWER_MAX_TOKENS": EVAL_ANSWER_MAX_TOKENS,
}
# The budget of each GRPO phase's answer: π1 writes a schema, π2 a table.
ROLLOUT = {"b1": SCHEMA_ANSWER_MAX_TOKENS, "c1": SCHEMA_ANSWER_MAX_TOKENS,
           "b2": TABLE_ANSWER_MAX_TOKENS, "c2": TABLE_ANSWER_MAX_TOKENS}  # fmt: skip


def option_default(path: tuple[str, ...], param: str) -> Any:
    """The default ``python -m trainer <path...>`` shows for ``param``."""
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # a group's subcommands
    (found,) = (p for p in cmd.params if p.name == param)
    return found.default


def field_default(config: type, name: str) -> Any:
    (found,) = (f for f in dataclasses.fields(config) if f.name == name)
    return found.default


def arg_default(func: Any, name: str) -> Any:
    default = inspect.signature(func).parameters[name].default
    return getattr(default, "default", default)  # a Typer OptionInfo holds its default


SITES: dict[str, tuple[Any, int]] = {
    # the trainer's own generation, outside a rollout
    "trainer infer --max-tokens": (lambda: option_default(("infer",), "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer data precompute-schemas --max-tokens": (
        lambda: option_default(("data", "precompute-schemas"), "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer evaluate pipeline --max-tokens": (
        lambda: option_default(("evaluate", "pipeline"), "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer rft --max-tokens": (lambda: option_default(("rft",), "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer preflight --max-tokens": (lambda: option_default(("preflight",), "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer loop --eval-max-tokens": (lambda: option_default(("loop",), "eval_max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "trainer experiment pi1-ab --eval-max-tokens": (
        lambda: option_default(("experiment", "pi1-ab"), "eval_max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "GenerationConfig.max_tokens": (lambda: field_default(GenerationConfig, "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "RftConfig.max_tokens": (lambda: field_default(RftConfig, "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "advantage_check(max_tokens=)": (lambda: arg_default(advantage_check, "max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "LoopConfig.eval_max_tokens": (lambda: field_default(LoopConfig, "eval_max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    "ExperimentConfig.eval_max_tokens": (
        lambda: field_default(ExperimentConfig, "eval_max_tokens"), EVAL_ANSWER_MAX_TOKENS),
    # π2's table outside a rollout: the reward API's Stage-2 executor
    "REWARD_API_MAX_TOKENS": (lambda: Settings.model_fields["max_tokens"].default, TABLE_ANSWER_MAX_TOKENS),
    "serve_reward_api(max_tokens=)": (lambda: arg_default(serve_reward_api, "max_tokens"), TABLE_ANSWER_MAX_TOKENS),
    "trainer loop --reward-max-tokens": (
        lambda: option_default(("loop",), "reward_max_tokens"), TABLE_ANSWER_MAX_TOKENS),
    "trainer experiment pi1-ab --reward-max-tokens": (
        lambda: option_default(("experiment", "pi1-ab"), "reward_max_tokens"), TABLE_ANSWER_MAX_TOKENS),
    "RunConfig.reward_max_tokens": (
        lambda: field_default(RunConfig, "reward_max_tokens"), TABLE_ANSWER_MAX_TOKENS),
    # the phase registry's rollout lengths
    **{f"PHASES[{p!r}].max_response_length": ((lambda p=p: PHASES[p].max_response_length), v)
       for p, v in ROLLOUT.items()},
    # the small-scale overrides, each read from its one name
    "trainer demo --max-tokens": (lambda: option_default(("demo",), "max_tokens"), DEMO_MAX_TOKENS),
    "DemoSettings.max_tokens": (lambda: field_default(DemoSettings, "max_tokens"), DEMO_MAX_TOKENS),
    "grpo smoke --response-len": (lambda: arg_default(smoke_grpo.main, "response_len"), smoke_grpo.SMOKE_MAX_TOKENS),
    "grpo smoke --executor-max-tokens": (
        lambda: arg_default(smoke_grpo.main, "executor_max_tokens"), smoke_grpo.SMOKE_MAX_TOKENS),
}  # fmt: skip


@pytest.mark.parametrize("site", list(SITES))
def test_each_default_reads_its_knob(site: str) -> None:
    read, knob = SITES[site]
    assert read() == knob, site


def test_every_recipe_declares_no_knob_of_its_own_twice() -> None:
    """The settings every recipe shares are RunConfig's fields, declared there once: neither recipe's config
    declares one of them again (a redeclared field would shadow the shared default and help)."""
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    for config in (LoopConfig, ExperimentConfig):
        assert issubclass(config, RunConfig)
        assert not shared & set(inspect.get_annotations(config)), config
    own = [set(inspect.get_annotations(config)) for config in (LoopConfig, ExperimentConfig)]
    assert not own[0] & own[1], own[0] & own[1]  # a knob both recipes have belongs in RunConfig


def test_the_overrides_are_smaller_than_what_they_override() -> None:
    overrides = {
        DEMO_MAX_TOKENS: (EVAL_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS),
        smoke_grpo.SMOKE_MAX_TOKENS: (SCHEMA_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS),
        LOOP_SMOKE_MAX_TOKENS: (EVAL_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS),
    }
    for small, knobs in overrides.items():
        assert all(small < knob for knob in knobs), (small, knobs)


@pytest.mark.parametrize("phase", list(ROLLOUT))
def test_each_grpo_phase_config_sets_its_answers_budget(phase: str) -> None:
    raw = yaml.safe_load((CONFIGS / f"{phase}_grpo.yaml").read_text())
    assert raw["data"]["max_response_length"] == ROLLOUT[phase]


def test_every_grpo_phase_is_covered_and_cpu_smoke_is_a_smaller_override() -> None:
    assert sorted(ROLLOUT) == sorted(p for p, ph in PHASES.items() if ph.kind == "grpo")
    smoke = yaml.safe_load((CONFIGS / "profile" / "cpu-smoke.yaml").read_text())
    assert smoke["data"]["max_response_length"] == smoke_grpo.SMOKE_MAX_TOKENS
    gpu = yaml.safe_load((CONFIGS / "profile" / "gpu.yaml").read_text()) or {}
    assert "max_response_length" not in (gpu.get("data") or {})  # the gpu profile keeps the phases' own


def test_the_docs_table_states_the_knobs() -> None:
    table = DOC.read_text().split("### Max new tokens of an answer", 1)[1].split("\n#", 1)[0]
    for name, value in KNOBS.items():
        line = next((ln for ln in table.splitlines() if ln.startswith(f"| `{name}` |")), "")
        assert line.startswith(f"| `{name}` | {value} |"), (name, value, line)

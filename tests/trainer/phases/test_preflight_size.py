"""One preflight size (``PreflightSize``, ``trainer/checks/preflight.py``): ``trainer preflight``'s ``--n`` and
``--prompts``, ``advantage_check``'s defaults and the recipes' ``--preflight-n`` / ``--preflight-prompts`` (the
loop's ``--preflight-min``, the experiments' sweep) all hold its defaults; the loop hands them to the check
(``tests/trainer/runs/test_loop_gpu.py``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from tests.trainer.evaluation.test_generation_settings import command_defaults
from trainer.checks.preflight import PreflightSize, advantage_check
from trainer.runs.config import ExperimentConfig, LoopConfig, RunConfig

ONE = PreflightSize()
PARAMS: dict[str, tuple[str, Any]] = {
    "n": ("n", ONE.n), "prompts": ("prompts", ONE.prompts),
    "preflight_n": ("n", ONE.n), "preflight_prompts": ("prompts", ONE.prompts),
}  # fmt: skip
EXPECTED = {
    ("preflight", "n"), ("preflight", "prompts"),
    *((*cmd, p) for cmd in (("loop",), ("experiment", "pi1-ab"), ("experiment", "pi2-ab"))
      for p in ("preflight_n", "preflight_prompts")),
}  # fmt: skip


def test_the_commands_take_the_preflight_size_from_the_type() -> None:
    found = command_defaults(PARAMS)
    # positive-control's --prompts is its prompt set (a file), another knob
    found = {site: d for site, d in found.items() if site != ("positive-control", "prompts")}
    assert set(found) >= EXPECTED, EXPECTED - set(found)
    wrong = {site: d for site, d in found.items() if d != PARAMS[site[-1]][1]}
    assert not wrong, wrong


@pytest.mark.parametrize("config", [RunConfig, LoopConfig, ExperimentConfig])
def test_the_recipes_configs_hold_it(config: type) -> None:
    fields = {f.name: f.default for f in dataclasses.fields(config)}
    assert (fields["preflight_n"], fields["preflight_prompts"]) == (ONE.n, ONE.prompts)


def test_the_check_itself_defaults_to_it() -> None:
    params = inspect.signature(advantage_check).parameters
    assert (params["n"].default, params["prompts"].default) == (ONE.n, ONE.prompts)


def test_the_size_is_the_phases_rollout_n() -> None:
    """16 samples (the gpu profile's rollout.n) of 64 prompts per source (docs/training.md's recipe)."""
    import yaml

    from trainer.phases.launch import CONFIG_DIR

    gpu = yaml.safe_load((CONFIG_DIR / "profile" / "gpu.yaml").read_text())
    assert ONE.n == gpu["actor_rollout_ref"]["rollout"]["n"] == 16
    assert ONE.prompts == 64

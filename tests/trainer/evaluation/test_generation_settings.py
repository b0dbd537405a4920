"""One default per generation knob (``GenerationSettings``, ``trainer/evaluation/generation.py``): every entry point's
default for max tokens, concurrency, timeout and the evaluation executors' serving mode, read as a user meets it
(each ``python -m trainer`` command's options, the configs' fields, the client's own default), equals the type's.
An entry point that restates another default fails here; a command option of one of these names is checked
wherever it appears, so a new command is covered without a line here."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console

from trainer.cli import app
from trainer.demo.runner import Demo
from trainer.demo.settings import DEMO_MAX_TOKENS, DemoSettings
from trainer.evaluation.generation import GenerationClient, GenerationConfig, GenerationSettings
from trainer.rft import RftConfig
from trainer.runs.config import ExperimentConfig, LoopConfig, RunConfig

ONE = GenerationSettings()

# A command parameter's name → the knob it is, and that knob's default as the command line gives it.
PARAMS: dict[str, tuple[str, Any]] = {
    "max_tokens": ("max_tokens", ONE.max_tokens),
    "eval_max_tokens": ("max_tokens", ONE.max_tokens),
    "concurrency": ("concurrency", ONE.concurrency),
    "eval_concurrency": ("concurrency", ONE.concurrency),
    "timeout": ("timeout_s", ONE.timeout_s),
    "eval_timeout_s": ("timeout_s", ONE.timeout_s),
    "executor_cuda_graphs": ("eager", not ONE.eager),  # the flag says CUDA graphs: on where eager is off
}
# Options of those names that are another knob, or a named override of one (with why).
NOT_THE_KNOB = {
    ("serve", "wait", "timeout"): "how long to wait for executors to start",
    ("demo", "max_tokens"): "DEMO_MAX_TOKENS, the CPU demo's named override (tests/test_max_tokens.py)",
}
# Where the knobs must appear: the entry points this type is the source of.
EXPECTED = {
    ("infer",): {"max_tokens", "concurrency", "timeout"},
    ("evaluate", "pipeline"): {"max_tokens", "concurrency", "timeout"},
    ("data", "precompute-schemas"): {"max_tokens", "concurrency", "timeout"},
    ("rft",): {"max_tokens", "concurrency", "timeout"},
    ("preflight",): {"max_tokens"},
    ("loop",): {"eval_max_tokens", "eval_concurrency", "eval_timeout_s", "executor_cuda_graphs"},
    ("experiment", "pi1-ab"): {"eval_max_tokens", "eval_concurrency", "eval_timeout_s", "executor_cuda_graphs"},
    ("experiment", "pi2-ab"): {"eval_max_tokens", "eval_concurrency", "eval_timeout_s", "executor_cuda_graphs"},
}


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command of ``python -m trainer`` with its path (``("evaluate", "pipeline")``)."""
    cmd = typer.main.get_command(app) if cmd is None else cmd
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from commands(sub, (*path, name))


def command_defaults(names: dict[str, tuple[str, Any]]) -> dict[tuple[str, ...], Any]:
    """(command path..., parameter) → its default, for every option named in ``names``, less :data:`NOT_THE_KNOB`."""
    found = {}
    for path, cmd in commands():
        for p in cmd.params:
            if p.name in names and (*path, p.name) not in NOT_THE_KNOB:
                found[(*path, p.name)] = p.default
    return found


def test_the_commands_take_each_knobs_default_from_the_type() -> None:
    found = command_defaults(PARAMS)
    wrong = {site: (default, PARAMS[site[-1]]) for site, default in found.items() if default != PARAMS[site[-1]][1]}
    assert not wrong, f"option default → (knob, the one default): {wrong}"
    missing = {(*path, p) for path, params in EXPECTED.items() for p in params} - set(found)
    assert not missing, f"these entry points lost a generation option: {missing}"


def test_the_named_exceptions_are_still_there() -> None:
    """Each exception names an option that exists (a stale one would hide a restated default)."""
    every = {(*path, p.name): p.default for path, cmd in commands() for p in cmd.params}
    assert set(NOT_THE_KNOB) <= set(every)
    assert every[("demo", "max_tokens")] == DEMO_MAX_TOKENS


def field_default(config: type, name: str) -> Any:
    (found,) = (f for f in dataclasses.fields(config) if f.name == name)
    return found.default


CLIENT_KNOBS = ("max_tokens", "concurrency", "timeout_s")
# A config field or object attribute → the knob whose default it must hold.
FIELDS: dict[str, tuple[Any, str]] = {
    **{f"{c.__name__}.{k}": (lambda c=c, k=k: field_default(c, k), k)
       for c in (GenerationConfig, RftConfig) for k in CLIENT_KNOBS},
    **{f"{c.__name__}.eval_{k}": (lambda c=c, k=k: field_default(c, f"eval_{k}"), k)
       for c in (RunConfig, LoopConfig, ExperimentConfig) for k in CLIENT_KNOBS},
    **{f"{c.__name__}.executor_eager": (lambda c=c: field_default(c, "executor_eager"), "eager")
       for c in (RunConfig, LoopConfig, ExperimentConfig)},
    "a run's executors' prefix caching": (
        lambda: RunConfig(golden=Path("g")).executor_prefix_caching, "prefix_caching"),
    **{f"GenerationClient without settings: {k}": (lambda k=k: getattr(GenerationClient("http://x", "m").gen, k), k)
       for k in CLIENT_KNOBS},
    **{f"the demo's {k}": (lambda k=k: getattr(Demo(DemoSettings(), Console()).gen, k), k)
       for k in ("concurrency", "timeout_s")},
    **{f"the demo's executors' {k}": (lambda k=k: getattr(Demo(DemoSettings(), Console()).generation, k), k)
       for k in ("eager", "prefix_caching")},
}  # fmt: skip


@pytest.mark.parametrize("site", list(FIELDS))
def test_each_config_holds_the_one_default(site: str) -> None:
    read, knob = FIELDS[site]
    assert read() == getattr(ONE, knob), site


def test_the_demo_overrides_only_its_max_tokens() -> None:
    gen = Demo(DemoSettings(), Console()).generation
    assert gen == dataclasses.replace(ONE, max_tokens=DEMO_MAX_TOKENS)


def test_the_defaults_are_the_loops() -> None:
    """The loop's Phase D's values (docs/reliability.md: another concurrency is another evaluation), so that
    `trainer evaluate pipeline` at its defaults evaluates as the loop does."""
    assert (ONE.concurrency, ONE.timeout_s, ONE.eager, ONE.prefix_caching) == (256, 600.0, True, False)
    assert ONE.config() == GenerationConfig(max_tokens=ONE.max_tokens, concurrency=256, timeout_s=600.0)


def test_the_docs_state_the_one_default_and_where_it_lives() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    trainer_md, training_md = (docs / "trainer.md").read_text(), (docs / "training.md").read_text()
    for text in (f"`--concurrency` ({ONE.concurrency} requests in flight)", f"`--timeout` ({ONE.timeout_s:g} s",
                 "`GenerationSettings` (`trainer/evaluation/generation.py`"):  # fmt: skip
        assert text in trainer_md, text
    for text in (f"`--eval-concurrency` ({ONE.concurrency})", f"`--eval-timeout-s` ({ONE.timeout_s:g})"):
        assert text in training_md, text

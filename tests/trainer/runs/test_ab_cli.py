"""The experiment commands are generated from ExperimentConfig: every field is an option with its help,
the options land in the config, and --dry-run prints the plan without starting anything."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.trainer.runs.test_loop import SAMPLE
from trainer.runs.config import ExperimentConfig


def options(command: str) -> dict[str, str]:
    from typer.main import get_command

    from trainer.cli import app

    group = get_command(app).commands["experiment"]  # type: ignore[attr-defined]
    return {p.name: getattr(p, "help", "") or "" for p in group.commands[command].params if p.name}


@pytest.mark.parametrize("command", ["pi1-ab", "pi2-ab"])
def test_every_config_field_is_an_option_with_its_help(command: str) -> None:
    opts = options(command)
    for f in dataclasses.fields(ExperimentConfig):
        assert f.metadata.get("help"), f"ExperimentConfig.{f.name} has no help text"
        name = f.metadata["option"] or f.name
        assert opts.get(name) == f.metadata["help"], f.name
    assert len(opts) == len(dataclasses.fields(ExperimentConfig))


def test_help_lists_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.cli import app

    # wide enough that no option's name is cut: typer's own width setting (read once, from TERMINAL_WIDTH), since
    # COLUMNS did not reach rich in CI's light lane (its help came out 80 columns wide)
    monkeypatch.setattr("typer.rich_utils.MAX_WIDTH", 400)
    res = CliRunner().invoke(app, ["experiment", "pi1-ab", "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    for f in dataclasses.fields(ExperimentConfig):
        flag = "--" + (f.metadata["option"] or f.name).replace("_", "-")
        assert flag in res.output, flag


def test_options_reach_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import run_cli
    from trainer.cli import app

    seen: list[tuple[str, ExperimentConfig]] = []

    class Capturing:
        def __init__(self, design: Any, cfg: ExperimentConfig, **_: Any) -> None:
            seen.append((design.name, cfg))
            self.ctx = type("C", (), {"root": tmp_path})()

        def run(self) -> dict[str, Any]:
            return {}

    monkeypatch.setattr(run_cli, "Experiment", Capturing)
    base = ["experiment", "pi2-ab", "--golden", str(SAMPLE), "--out", str(tmp_path)]
    given = [
        "--profile", "gpu", "--gpus", "2,3", "--base-model", "/b", "--sft-from", str(tmp_path), "--data-phases",
        "a1,a2,b1,c1,b2", "--limit", "5", "--sft-mix", "e2e=2", "--sft-override", "a=1", "--sft-override", "b=2",
        "--temps", "0.8,1.2",
        "--preflight-phases", "b2,c2", "--preflight-prompts", "8", "--preflight-sources", "wikitabletext,e2e",
        "--preflight-n", "4", "--min-share", "0.2", "--force-rl", "--min-source-share", "0.3", "--rl-improvable",
        "--rl-sources", "wikitabletext", "--rl-mix-share", "0.25", "--control", "parallel", "--control-stagger-s", "10",
        "--c2-train-prompts", "99", "--rl-steps", "3", "--rl-test-freq", "1",
        "--rl-micro", "8", "--rl-seed", "4", "--rl-extra", "x=1", "--rl-extra", "y=2", "--rl-stagger-s", "5",
        "--reward-max-tokens", "96",
        "--eval-limit", "4",
        "--eval-max-tokens", "64", "--eval-max-truncated-share", "0.5", "--eval-max-refused-share", "0.25",
        "--eval-concurrency", "2",
        "--eval-timeout-s", "30", "--reward-workers", "3", "--executor-cuda-graphs", "--strict-splits",
    ]  # fmt: skip
    res = CliRunner().invoke(app, [*base, *given])
    assert res.exit_code == 0, res.output
    name, cfg = seen[-1]
    assert name == "pi2-ab"
    assert cfg == ExperimentConfig(
        golden=SAMPLE, out=tmp_path, profile="gpu", gpus=("2", "3"), base_model="/b", sft_from=tmp_path,
        data_phases=("a1", "a2", "b1", "c1", "b2"), limit=5, sft_mix="e2e=2", sft_overrides=("a=1", "b=2"),
        temps=(0.8, 1.2),
        preflight_phases=("b2", "c2"), preflight_prompts=8, preflight_sources=("wikitabletext", "e2e"), preflight_n=4,
        min_share=0.2,
        force_rl=True, min_source_share=0.3, rl_improvable=True, rl_sources=("wikitabletext",), rl_mix_share=0.25,
        control="parallel", control_stagger_s=10.0,
        c2_train_prompts=99, rl_steps=3, rl_test_freq=1, rl_micro=8, rl_seed=4, rl_extra=("x=1", "y=2"),
        rl_stagger_s=5.0,
        reward_max_tokens=96, eval_limit=4, eval_max_tokens=64, eval_max_truncated_share=0.5, eval_concurrency=2,
        eval_max_refused_share=0.25, eval_timeout_s=30.0, reward_workers=3, executor_eager=False, strict_splits=True,
    )  # fmt: skip
    # every field but the dry run was given something other than its default
    default = ExperimentConfig(golden=SAMPLE, out=tmp_path)
    changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(default, f.name)}
    assert changed | {"golden", "out", "profile", "dry_run"} == {f.name for f in dataclasses.fields(cfg)}
    bad = CliRunner().invoke(app, [*base, "--profile", "cpu-smoke", "--control", "later"], env={"COLUMNS": "400"})
    assert bad.exit_code == 2 and "--control" in bad.output and "'later'" in bad.output
    for share, why in (("1", "at least 0 and below 1"), ("0.2", "needs --rl-sources or --rl-improvable")):
        args = [*base, "--profile", "cpu-smoke", "--rl-mix-share", share]
        bad = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", bad.output).split())  # rich's box may wrap the message
        assert bad.exit_code == 2 and "--rl-mix-share" in flat and why in flat, bad.output


@pytest.mark.parametrize(
    ("args", "placement", "stagger"),
    [
        (["--profile", "cpu-smoke"], "CPU: every process", "(the arms in turn on CPU)"),
        (["--gpus", "0"], "arm A on GPU 0, arm B on GPU 0 (one card shared: arm B staggered)", "arm B starts 90 s"),
        (["--gpus", "0,1"], "arm A on GPU 0, arm B on GPU 1", None),
        (["--gpus", "0,1,2,3"], "arm A on GPU 0,1, arm B on GPU 2,3", None),
    ],
)
def test_dry_run_prints_the_plan_and_starts_nothing(
    tmp_path: Path, args: list[str], placement: str, stagger: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.cli import app
    from trainer.runs.ab import Experiment

    monkeypatch.setattr(Experiment, "run", lambda self: pytest.fail("--dry-run ran the experiment"))
    cmd = ["experiment", "pi1-ab", "--golden", str(SAMPLE), "--out", str(tmp_path / "ab"), "--base-model", "/b"]
    res = CliRunner().invoke(app, [*cmd, *args, "--dry-run"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert placement in out
    assert [line for line in out.splitlines() if line.startswith("[")] == [
        "[sft]", "[preflight]", "[choose]", "[control]", "[rl]", "[eval]"
    ]  # fmt: skip
    assert "executors start: pi1-sft, pi2-sft" in out
    if "cpu-smoke" in args:  # GRPO needs the memory: the executors stop before RL; eval starts π1ˢ again
        # (the positive control trains first: everything stops; RL starts the pipeline reward's π2ˢ again)
        assert "executors stop: pi1-sft, pi2-sft" in out and "executors start: pi1-sft, pi1-local, pi1-pipe" in out
    else:
        assert "executors reuse: pi1-sft, pi2-sft" in out and "executors stop" not in out
    assert "b1_grpo" in out and "c1_grpo" in out and "actor_rollout_ref.rollout.temperature=<chosen T>" in out
    assert (stagger in out) if stagger else ("arm B starts" not in out)
    assert not (tmp_path / "ab").exists()


def test_dry_run_does_not_convert_the_default_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.cli import app

    monkeypatch.setattr("services.executor_vllm.default_model.convert", lambda: pytest.fail("converted"))
    cmd = ["experiment", "pi2-ab", "--golden", str(SAMPLE), "--out", str(tmp_path / "ab"), "--profile", "cpu-smoke"]
    res = CliRunner().invoke(app, [*cmd, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "model <SmolLM2-135M-Instruct, converted on the first run>" in res.output
    assert "[c2data] (beside preflight)" in res.output and "π2 on gold schemas" in res.output


def test_dry_run_names_the_mixed_arms(tmp_path: Path) -> None:
    from trainer.cli import app

    cmd = ["experiment", "pi2-ab", "--golden", str(SAMPLE), "--out", str(tmp_path / "ab"), "--base-model", "/b",
           "--profile", "cpu-smoke", "--rl-sources", "people", "--rl-mix-share", "0.3", "--dry-run"]  # fmt: skip
    res = CliRunner().invoke(app, cmd, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "b2: 0.3 of its prompts from the other sources" in res.output and "c2: not mixed" in res.output
    assert not (tmp_path / "ab").exists()

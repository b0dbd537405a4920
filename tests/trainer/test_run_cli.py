"""The recipes' configs are declared once: every LoopConfig field is an option of ``trainer loop`` (with its help
text), and the run record holds the config whole."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.runs.test_loop import SAMPLE
from trainer.runs.config import LoopConfig
from trainer.runs.record import RECORD, RunRecord


def option_names() -> dict[str, str]:
    """The loop command's options: parameter name → help."""
    from typer.main import get_command

    from trainer.cli import app

    click_cmd = get_command(app).commands["loop"]  # type: ignore[attr-defined]
    return {p.name: getattr(p, "help", "") or "" for p in click_cmd.params if p.name}


def test_every_config_field_is_an_option_with_help() -> None:
    options = option_names()
    for f in dataclasses.fields(LoopConfig):
        assert f.metadata.get("help"), f"LoopConfig.{f.name} has no help text"
        name = f.metadata["option"] or f.name
        assert name in options, f"LoopConfig.{f.name} is no option of `trainer loop`"
        assert options[name] == f.metadata["help"], f.name
    # the options the command had before they were generated (names kept), and the ones it lacked
    before = {
        "golden", "out", "profile", "pi1_sft", "pi2_sft", "base_model", "sft_override", "reward_url",
        "c1_reward_url", "pi1_pipe_url", "limit", "eval_limit", "loops", "min_gain", "rft", "rft_k",
        "rft_threshold", "gpus", "until", "reward_workers", "preflight_min", "c2_train_prompts",
        "executor_cuda_graphs",
    }  # fmt: skip
    added = {"decision_metric", "reward_max_tokens", "eval_max_tokens", "eval_max_truncated_share", "rl_sources",
             "eval_max_refused_share",
             "eval_base", "sft_mix", "rl_mix_share", "rl_seed", "rl_extra", "eval_concurrency",
             "eval_timeout_s", "strict_splits", "preflight_prompts", "preflight_n"}  # fmt: skip
    assert before | added == set(options)


def capture_loop_configs(monkeypatch: pytest.MonkeyPatch) -> list[LoopConfig]:
    """``trainer loop``'s command with the loop replaced by one that keeps its config and runs nothing."""
    from trainer import run_cli

    seen: list[LoopConfig] = []

    class CapturingLoop:
        def __init__(self, cfg: LoopConfig) -> None:
            seen.append(cfg)

        def run(self) -> dict[str, object]:
            return {}

    monkeypatch.setattr(run_cli, "Loop", CapturingLoop)
    return seen


def test_options_reach_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each option lands in its field, the fields unreachable before included; the defaults are the config's."""
    from trainer.cli import app

    seen = capture_loop_configs(monkeypatch)
    base = ["loop", "--golden", str(SAMPLE), "--out", str(tmp_path), "--profile", "cpu-smoke"]
    res = CliRunner().invoke(app, [*base, "--pi1-sft", "/p1", "--pi2-sft", "/p2"])
    assert res.exit_code == 0, res.output
    defaults = LoopConfig(golden=SAMPLE, out=tmp_path, profile="cpu-smoke", pi1_sft="/p1", pi2_sft="/p2")
    assert seen[-1] == defaults
    given = [
        "--pi1-sft", "/p1", "--pi2-sft", "/p2", "--base-model", "/b", "--sft-override", "a=1", "--sft-override",
        "b=2", "--reward-url", "http://r", "--c1-reward-url", "http://c1", "--pi1-pipe-url", "http://p",
        "--limit", "5", "--eval-limit", "3", "--loops", "2", "--min-gain", "0.5", "--decision-metric",
        "cell_accuracy", "--reward-max-tokens", "384", "--eval-max-tokens", "128", "--eval-max-truncated-share",
        "0.5", "--eval-max-refused-share", "0.25", "--no-eval-base", "--rft",
        "--rft-k", "2", "--rft-threshold", "0.25", "--until", "c1", "--reward-workers", "2", "--preflight-min", "0.3",
        "--c2-train-prompts", "7", "--rl-sources", "wikitabletext", "--rl-mix-share", "0.25", "--sft-mix", "e2e=2",
        "--executor-cuda-graphs", "--rl-seed", "3", "--rl-extra", "w=0", "--eval-concurrency", "8",
        "--eval-timeout-s", "60", "--strict-splits", "--preflight-prompts", "8", "--preflight-n", "4", "x=1", "y=2",
    ]  # fmt: skip
    res = CliRunner().invoke(app, [*base, *given])
    assert res.exit_code == 0, res.output
    assert seen[-1] == LoopConfig(
        golden=SAMPLE, out=tmp_path, profile="cpu-smoke", pi1_sft="/p1", pi2_sft="/p2", base_model="/b",
        sft_overrides=("a=1", "b=2"), reward_url="http://r", c1_reward_url="http://c1", pi1_pipe_url="http://p",
        limit=5, eval_limit=3, loops=2, min_gain=0.5, decision_metric="cell_accuracy", rl_extra=("w=0", "x=1", "y=2"),
        reward_max_tokens=384, eval_max_tokens=128, eval_max_truncated_share=0.5, eval_base=False, rft=True,
        eval_max_refused_share=0.25, rft_k=2, rft_threshold=0.25, gpus=(),
        until="c1", reward_workers=2, preflight_min=0.3, executor_eager=False, c2_train_prompts=7,
        rl_sources=("wikitabletext",), rl_mix_share=0.25, sft_mix="e2e=2", rl_seed=3, eval_concurrency=8,
        eval_timeout_s=60.0, strict_splits=True, preflight_prompts=8, preflight_n=4,
    )  # fmt: skip
    # every field was given something other than its default above (gpus: the cpu-smoke profile has none)
    changed = {f.name for f in dataclasses.fields(LoopConfig) if getattr(seen[-1], f.name) != getattr(defaults, f.name)}
    assert changed | {"golden", "out", "profile", "pi1_sft", "pi2_sft", "gpus"} == {
        f.name for f in dataclasses.fields(LoopConfig)
    }
    for share, why in (("1", "at least 0 and below 1"), ("0.2", "needs --rl-sources")):
        bad = CliRunner().invoke(app, [*base, "--pi1-sft", "/p1", "--pi2-sft", "/p2", "--rl-mix-share", share],
                                 env={"COLUMNS": "400"})  # fmt: skip
        flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", bad.output).split())  # rich's box may wrap the message
        assert bad.exit_code == 2 and "--rl-mix-share" in flat and why in flat, bad.output


def test_the_run_record_holds_the_config_whole(tmp_path: Path) -> None:
    cfg = LoopConfig(
        golden=SAMPLE, out=tmp_path, profile="gpu", pi1_sft="/p1", pi2_sft="/p2", sft_overrides=("a=1",),
        decision_metric="cell_accuracy", eval_max_tokens=128, gpus=("0", "1"), rft=True, rft_k=3,
    )  # fmt: skip
    RunRecord.open(tmp_path, "loop", cfg).set("parts", {})  # the config is written with the first entry
    m = json.loads((tmp_path / RECORD).read_text())
    assert m["recipe"] == "loop"
    config = m["config"]
    assert set(config) == {f.name for f in dataclasses.fields(LoopConfig)}
    # read back, it is the same config
    hints = {"golden": Path, "out": Path}
    tuples = {f.name for f in dataclasses.fields(LoopConfig) if isinstance(f.default, tuple)}
    back = {k: hints[k](v) if k in hints else tuple(v) if k in tuples else v for k, v in config.items()}
    assert LoopConfig(**back) == cfg


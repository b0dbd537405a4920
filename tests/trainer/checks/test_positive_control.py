"""The positive control: its command line (the phase's recipe on the improvable prompts) and its verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.trainer.phase_rules.test_monitors import RECORDED
from tests.trainer.phases.test_gpu_profile import composed_command
from tests.trainer.phases.test_launch import env  # noqa: F401  (a fixture)
from trainer.checks.positive_control import ControlConfig, control_run, greedy_rewards, judge, pick_prompts
from trainer.phases.launch import read_metrics
from trainer.registry.phases import get_phase


def _val(step: int, **by_source: float) -> dict[str, Any]:
    return {"step": step, "data": {f"val-core/{ds.replace('__', ':')}/reward/mean@1": v for ds, v in by_source.items()}}


@pytest.mark.parametrize("profile", ["gpu", "cpu-smoke"])
def test_the_control_is_the_phase_recipe_on_its_own_prompts(env: None, profile: str, tmp_path: Path) -> None:  # noqa: F811
    cfg = ControlConfig(size=16, steps=8)
    run = control_run(get_phase("b2"), profile, tmp_path / "improvable.parquet", tmp_path / "ctl", "/m",  # type: ignore[arg-type]
                      "http://127.0.0.1:1", cfg, ("actor_rollout_ref.rollout.n=4",))  # fmt: skip
    c = composed_command(run)
    chosen = str((tmp_path / "ctl" / "control_prompts.parquet").resolve())
    assert c.data.train_files == c.data.val_files == chosen  # trained and validated on the same prompts
    assert c.data.train_max_samples == c.data.val_max_samples == -1
    assert c.data.train_batch_size == 16 and c.actor_rollout_ref.actor.ppo_mini_batch_size == 4  # 4 updates a step
    assert c.trainer.total_training_steps == 8 and c.trainer.total_epochs == 8
    assert c.trainer.test_freq == c.trainer.save_freq == 2 and c.trainer.val_before_train is True
    assert c.early_stopping.enabled is False
    assert c.actor_rollout_ref.rollout.val_kwargs.do_sample is False  # validation = the greedy answer
    assert c.actor_rollout_ref.rollout.n == 4  # the user's override comes last and wins
    if profile == "gpu":  # the recipe itself is untouched
        assert c.algorithm.filter_groups.enable and c.algorithm.norm_adv_by_std_in_grpo is False
        assert c.actor_rollout_ref.actor.clip_ratio_high == pytest.approx(0.28)
        # micro batches are left to sizing, which divides the control's mini batch (4 prompts x 4 samples)
        assert c.sizing.auto is True and c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is None
        from trainer.phases.sizing import SizingRule, choose

        mini_samples = 4 * c.actor_rollout_ref.rollout.n
        assert mini_samples % choose(134_479_872, mini_samples, SizingRule()).micro_batch == 0
    else:
        assert c.trainer.device == "cpu"


def test_the_verdict_needs_the_macro_greedy_gain() -> None:
    rows = [_val(0, table__wikitabletext=0.2, table__e2e=0.9), {"step": 3, "data": {"actor/kl_loss": 0.1}},
            _val(8, table__wikitabletext=0.32, table__e2e=0.9)]  # fmt: skip
    v = judge(rows, margin=0.05)
    assert v.passed and v.macro_gain == pytest.approx(0.06) and (v.step_before, v.step_after) == (0, 8)
    assert v.gain == {"table:e2e": 0.0, "table:wikitabletext": pytest.approx(0.12)}
    assert "passed" in v.reason and "0.5500 -> 0.6100" in v.reason
    failed = judge(rows, margin=0.07)
    assert not failed.passed and "FAILED" in failed.reason and "wiring" in failed.reason


def test_an_incomplete_run_fails_the_control() -> None:
    assert "no validation before training" in judge([_val(8, table=0.5)], 0.05).reason
    assert "no validation after training" in judge([_val(0, table=0.5)], 0.05).reason
    assert "no data source in common" in judge([_val(0, schema=0.5), _val(4, table=0.9)], 0.05).reason
    assert not judge([], 0.05).passed


def test_a_recorded_run_that_did_not_move_fails_the_control() -> None:
    rows = read_metrics(RECORDED)
    assert greedy_rewards(rows)[0] == {"schema": pytest.approx(0.98450, abs=1e-5)}
    v = judge(rows, 0.05)
    assert not v.passed and v.step_after == 10 and v.macro_gain == pytest.approx(0.0014, abs=1e-4)


def test_pick_prompts_and_config_checks(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tests.trainer.checks.test_preflight import _rl_parquet

    ids = _rl_parquet(tmp_path / "improvable.parquet")
    assert pick_prompts(tmp_path / "improvable.parquet", tmp_path / "c.parquet", ControlConfig(size=4)) == 4
    assert sorted(r["extra_info"]["id"] for r in pq.read_table(tmp_path / "c.parquet").to_pylist()) == sorted(ids)
    with pytest.raises(ValueError, match="4 prompts, the control needs 8"):
        pick_prompts(tmp_path / "improvable.parquet", tmp_path / "c.parquet", ControlConfig(size=8))
    for bad in ({"size": 6}, {"steps": 0}, {"margin": 0.0}):
        with pytest.raises(ValueError):
            ControlConfig(**bad)  # type: ignore[arg-type]


def test_positive_control_dry_run_prints_the_command(tmp_path: Path) -> None:
    from trainer.phases.cli import app

    (tmp_path / "imp.parquet").write_bytes(b"")
    res = CliRunner().invoke(app, ["positive-control", "b1", "--prompts", str(tmp_path / "imp.parquet"), "--model",
                                   "/m", "--reward-url", "http://r", "--out", str(tmp_path / "o"), "--dry-run",
                                   "trainer.n_gpus_per_node=1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "trainer.in_verl.verl_main --config-name b1_grpo profile=gpu" in out
    assert "early_stopping.enabled=false" in out and out.endswith("trainer.n_gpus_per_node=1")
    bad = CliRunner().invoke(app, ["positive-control", "a1", "--prompts", str(tmp_path / "imp.parquet"), "--dry-run"])
    assert bad.exit_code == 2 and "GRPO phase" in " ".join(bad.output.replace("│", " ").split())


def test_run_control_judges_an_exhausted_run_on_its_last_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.trainer.checks.test_preflight import _rl_parquet
    from trainer.checks import positive_control
    from trainer.phases.launch import PhaseResult

    _rl_parquet(tmp_path / "imp.parquet")
    cfg = ControlConfig(size=4, steps=8)
    run = control_run(get_phase("b2"), "gpu", tmp_path / "imp.parquet", tmp_path / "o", "/m", "http://r", cfg)

    def fake_run_phase(run: Any, export: bool = True) -> PhaseResult:
        rows = [_val(0, table=0.1), _val(2, table=0.2), _val(4, table=0.3)]
        (run.out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        failure = {"cause": cause, "message": "dynamic sampling ..."}
        return PhaseResult("b2", "gpu", "failed", 1, [], "/m", "/d", str(run.out_dir), "t", 1.0,
                           error="boom", failure=failure)  # fmt: skip

    monkeypatch.setattr(positive_control, "run_phase", fake_run_phase)
    cause = "dynamic_sampling_exhausted"
    _, v = positive_control.run_control(run, tmp_path / "imp.parquet", cfg)
    assert v.passed and v.step_after == 4 and "ran out of informative groups" in v.reason
    saved = json.loads((tmp_path / "o" / "positive_control.json").read_text())
    assert saved["verdict"]["passed"] is True and saved["config"]["size"] == 4
    cause = "reward_api_down"
    _, v = positive_control.run_control(run, tmp_path / "imp.parquet", cfg)
    assert not v.passed and "the run failed (boom)" in v.reason

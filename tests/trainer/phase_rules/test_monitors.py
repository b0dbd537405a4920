"""Monitors of a GRPO phase: did the policy move, and the dynamic-sampling budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.phase_rules.monitors import (
    DynamicSamplingBudget,
    DynamicSamplingExhaustedError,
    read_kl_floor,
    step_monitors,
    summarise,
    valid_output_metrics,
    write_monitor_config,
)
from trainer.phases.launch import read_metrics

# VERL's file logger of a recorded B1 run on one H200 (bench/results/learning_gpu_run/b1): 10 steps at lr 1e-5
RECORDED = Path(__file__).parent / "fixtures" / "b1_recorded_metrics.jsonl"


def test_a_recorded_run_with_slack_limits_did_not_move() -> None:
    rows = read_metrics(RECORDED)
    m = summarise(rows, kl_floor=0.01)
    assert m["policy_moved"] is False and m["verdict"].startswith("POLICY DID NOT MOVE")
    assert m["trained_steps"] == 10
    assert m["max_kl_to_ref"] == pytest.approx(0.00224136, rel=1e-5)  # step 10's actor/kl_loss
    assert m["max_clipfrac"] == pytest.approx(0.000671, rel=1e-2)  # clip fraction <= 7e-4: PPO's clip slack
    assert m["max_grad_norm"] == pytest.approx(0.2117, rel=1e-2)
    assert 0.009 < m["mean_entropy"] < 0.015 and m["last_entropy"] == pytest.approx(0.01172, rel=1e-2)
    assert m["max_abs_ppo_kl"] < 2e-4
    assert m["evicted_groups"] == 0.0 and m["mean_valid_share"] is None  # no dynamic sampling back then
    steps = {s["step"]: s for s in m["steps"]}
    assert steps[0] == {"step": 0, "val_valid_share": {"schema": 1.0}}  # validation before training
    assert steps[2]["ppo_kl"] == pytest.approx(4.818e-05, rel=1e-3) and steps[2]["score"] == pytest.approx(0.9705, 1e-3)
    assert summarise(rows, kl_floor=0.002)["policy_moved"] is True  # the floor decides, not the data


def test_dynamic_sampling_and_valid_share_are_summed_and_averaged() -> None:
    rows = [
        {"step": 1, "data": {"actor/kl_loss": 0.004, "actor/ppo_kl": -0.01, "training/filter_groups/evicted_samples": 5,
                             "training/dynamic_sampling/generated_prompts": 74, "training/valid_output/share": 0.9}},
        {"step": 2, "data": {"actor/kl_loss": 0.02, "actor/ppo_kl": 0.002, "training/valid_output/share": 0.7,
                             "val-aux/table:wikitabletext/valid_json/mean@1": 0.8,
                             "val-core/table:e2e/reward/mean@1": 1}},
        {"step": 3, "data": {"timing_s/step": 3.0}},  # nothing a monitor reads
    ]  # fmt: skip
    m = summarise(rows, kl_floor=0.01)
    assert m["policy_moved"] is True and m["max_kl_to_ref"] == 0.02 and m["max_abs_ppo_kl"] == 0.01
    assert m["evicted_groups"] == 5.0 and m["mean_valid_share"] == pytest.approx(0.8)
    assert [s["step"] for s in m["steps"]] == [1, 2]
    assert m["steps"][0]["generated_prompts"] == 74.0
    assert m["steps"][1]["val_valid_share"] == {"table:wikitabletext": 0.8}


def test_no_kl_logged_is_unknown_not_moved() -> None:
    m = summarise([{"step": 0, "data": {"val-core/schema/reward/mean@1": 0.5}}])
    assert m["policy_moved"] is None and "cannot tell" in m["verdict"] and m["trained_steps"] == 0
    assert step_monitors([]) == []


def test_without_the_kl_loss_and_the_old_log_prob_pass_the_update_gives_the_entropy() -> None:
    """The gpu recipe: no reference (use_kl_loss false), old log-probs from the rollout (bypass_mode), so VERL
    logs no actor/entropy; the update's actor/entropy_loss (calculate_entropy) stands in for it."""
    rows = [
        {"step": 1, "data": {"actor/ppo_kl": 1e-4, "actor/entropy_loss": 0.30, "actor/pg_clipfrac": 0.01}},
        {"step": 2, "data": {"actor/ppo_kl": -2e-4, "actor/entropy_loss": 0.20}},
        {"step": 3, "data": {"actor/ppo_kl": 1e-4, "actor/entropy": 0.5, "actor/entropy_loss": 0.1}},  # both: VERL's
    ]  # fmt: skip
    m = summarise(rows)
    assert [s["entropy"] for s in m["steps"]] == [0.30, 0.20, 0.5]
    assert m["mean_entropy"] == pytest.approx((0.3 + 0.2 + 0.5) / 3) and m["last_entropy"] == 0.5
    assert m["trained_steps"] == 3 and m["policy_moved"] is None
    assert "use_kl_loss=false" in m["verdict"] and "cannot tell" in m["verdict"]


def test_kl_floor_round_trip(tmp_path: Path) -> None:
    assert read_kl_floor(tmp_path) == 0.01  # no file: the default
    write_monitor_config(tmp_path / "ckpt", 0.05)
    assert read_kl_floor(tmp_path / "ckpt") == 0.05
    assert json.loads((tmp_path / "ckpt" / "monitors.json").read_text()) == {"kl_floor": 0.05}


class _Cfg(dict):  # attribute access like an OmegaConf node, enough for from_config
    def __getattr__(self, k: str) -> object:
        return self[k]


def _cfg(enable: bool, m: int, batch: int = 64) -> _Cfg:
    return _Cfg(algorithm=_Cfg(filter_groups=_Cfg(enable=enable, metric="reward", max_num_gen_batches=m)),
                data=_Cfg(train_batch_size=batch))  # fmt: skip


def test_dynamic_sampling_budget() -> None:
    b = DynamicSamplingBudget.from_config(_cfg(True, 8))
    assert b.max_prompts == 512
    b.check(3, 64, 448)  # exactly the budget
    with pytest.raises(DynamicSamplingExhaustedError, match=r"training step 3: .*generated 500 prompts and needs 13"):
        b.check(3, 500, 13)
    assert DynamicSamplingBudget.from_config(_cfg(True, 0)).max_prompts is None  # VERL's "no limit"
    assert DynamicSamplingBudget.from_config(_cfg(False, 8)).max_prompts is None
    DynamicSamplingBudget.from_config(_cfg(False, 8)).check(1, 10**6, 10**6)


def test_valid_output_share_skips_padding_and_samples_without_the_key() -> None:
    class Wrapped:  # TransferQueue may hand back NonTensorData-like wrappers
        def __init__(self, data: dict[str, object]) -> None:
            self.data = data

    fields = [
        {"reward_extra_info": {"valid_json": True}},
        Wrapped({"reward_extra_info": {"valid_json": False}}),
        {"reward_extra_info": {"valid_json": True}},
        {"reward_extra_info": {"valid_json": False}},  # padding
        {"reward_extra_info": {}},
    ]
    m = valid_output_metrics(fields, [False, False, False, True, False])
    assert m == {"training/valid_output/share": pytest.approx(2 / 3), "training/valid_output/samples": 3.0}
    assert valid_output_metrics([{}, {"reward_extra_info": {}}]) == {}


def test_run_phase_puts_the_monitors_into_the_phase_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from trainer.phases import launch
    from trainer.phases.launch import PhaseRun, read_result, run_phase
    from trainer.registry.phases import get_phase

    def fake_launch(run: PhaseRun, log_path: Path | None = None, timeout_s: float | None = None) -> int:
        shutil.copy(RECORDED, run.out_dir / "metrics.jsonl")  # what VERL's file logger wrote
        write_monitor_config(run.out_dir / "checkpoints", 0.002)  # what the trainer hook wrote from the config
        return 0

    monkeypatch.setattr(launch, "launch", fake_launch)
    (tmp_path / "o").mkdir()
    run = PhaseRun(get_phase("b1"), "gpu", tmp_path / "d", tmp_path / "o", "/m", "http://127.0.0.1:1")
    res = run_phase(run, export=False)
    assert res.monitors is not None and res.monitors["kl_floor"] == 0.002 and res.monitors["policy_moved"] is True
    back = read_result(tmp_path / "o")
    assert back is not None and back.monitors is not None
    assert back.monitors["max_kl_to_ref"] == pytest.approx(0.00224136)
    monkeypatch.setattr(launch, "filter_sft_lengths", lambda run, timeout_s=None: (run, 0, None))  # no data here
    sft = run_phase(PhaseRun(get_phase("a1"), "gpu", tmp_path / "d", tmp_path / "o", "/m"), export=False)
    assert sft.monitors is None  # SFT has no policy-gradient monitors

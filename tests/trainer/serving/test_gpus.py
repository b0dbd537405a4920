"""GPU assignment for the loop on 1, 2, 4 and 8 GPUs (pure functions: no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainer.serving import gpus as g
from trainer.serving.gpus import ExecutorSlot, GpuPlan, GpuPlanError, Placement, visible_gpus, waves

CONFIGS = Path(__file__).resolve().parents[3] / "trainer" / "phases" / "configs"


def ids(n: int) -> tuple[str, ...]:
    return tuple(str(i) for i in range(n))


def test_gpus_option_wins_over_the_environment() -> None:
    assert visible_gpus("2,3", {"CUDA_VISIBLE_DEVICES": "0"}) == ("2", "3")
    assert visible_gpus(None, {"CUDA_VISIBLE_DEVICES": "4, 5"}) == ("4", "5")


def test_no_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g, "_nvidia_smi_count", lambda: 0)
    with pytest.raises(GpuPlanError, match="--gpus"):
        visible_gpus(None, {})
    with pytest.raises(GpuPlanError, match="distinct"):
        visible_gpus("0,0", {})


def test_bare_node_counts_gpus_with_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g, "_nvidia_smi_count", lambda: 4)
    assert visible_gpus(None, {}) == ids(4)


def test_one_gpu_shares_it_and_runs_pairs_in_turn() -> None:
    plan = GpuPlan(ids(1))
    assert plan.pair() is None and plan.sft_pair() is None
    trainer, executors = plan.c1()
    assert trainer.gpus == ("0",) and executors == [ExecutorSlot(("0",), g.SHARED_EXECUTOR_MEMORY)]
    assert trainer.rollout_memory + executors[0].memory < 0.8  # room left for the FSDP actor and reference
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.35" in trainer.grpo_overrides()


@pytest.mark.parametrize(
    ("n", "pair", "sft", "c1_trainer", "c1_executors"),
    [
        (2, (("0",), ("1",)), (("0",), ("1",)), ("0",), [("1",)]),
        (4, (("0", "1"), ("2", "3")), (("0",), ("2",)), ("0", "1"), [("2",), ("3",)]),
        (8, (ids(4), ids(8)[4:]), (("0",), ("4",)), ids(4), [(str(i),) for i in range(4, 8)]),
        (3, (("0",), ("1",)), (("0",), ("1",)), ("0", "1"), [("2",)]),
    ],
)
def test_pairs_and_c1_on_several_gpus(n: int, pair: tuple, sft: tuple, c1_trainer: tuple, c1_executors: list) -> None:
    plan = GpuPlan(ids(n))
    left, right = plan.pair() or (None, None)
    assert (left.gpus, right.gpus) == pair  # type: ignore[union-attr]
    a1, a2 = plan.sft_pair() or (None, None)
    assert (a1.gpus, a2.gpus) == sft  # type: ignore[union-attr]  # SFT: one GPU of each half
    assert not set(left.gpus) & set(right.gpus)  # type: ignore[union-attr]
    trainer, executors = plan.c1()
    assert trainer.gpus == c1_trainer and [e.gpus for e in executors] == c1_executors
    # the executor never shares a GPU with the trainer once there are two
    assert not set(trainer.gpus) & {x for e in executors for x in e.gpus}
    assert trainer.nproc & (trainer.nproc - 1) == 0  # a power of two: VERL's batch sizes divide by it


def test_overrides_follow_the_placement() -> None:
    p = Placement(("0", "1"))
    assert p.grpo_overrides() == (
        "trainer.n_gpus_per_node=2",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={g.ROLLOUT_MEMORY}",
    )
    assert p.nproc == 2
    # ranks share a batch of 128: each rank's rows must divide by the micro batch (VERL asserts it), which stays
    # at most the profile's 64
    assert p.sft_overrides() == ("trainer.n_gpus_per_node=2", "data.micro_batch_size_per_gpu=64")
    assert Placement(("0",)).sft_overrides() == ("trainer.n_gpus_per_node=1",)
    assert Placement(tuple("0123")).sft_overrides()[1] == "data.micro_batch_size_per_gpu=32"
    assert Placement(tuple("01234567")).sft_overrides()[1] == "data.micro_batch_size_per_gpu=16"


def test_sft_batch_constant_is_the_gpu_profiles_batch() -> None:
    """``SFT_BATCH`` mirrors the gpu SFT profile: if the profile's batch changes, the micro batch rule must too."""
    profile = yaml.safe_load((CONFIGS / "sft_profile" / "gpu.yaml").read_text())
    assert profile["data"]["train_batch_size"] == g.SFT_BATCH
    assert profile["data"]["micro_batch_size_per_gpu"] == g.SFT_MICRO and g.SFT_BATCH % g.SFT_MICRO == 0


def test_eval_runs_settings_side_by_side_up_to_the_gpu_count() -> None:
    assert [s.gpus for s in GpuPlan(ids(8)).eval_slots(4)] == [("0",), ("1",), ("2",), ("3",)]
    assert len(GpuPlan(ids(2)).eval_slots(4)) == 2
    assert waves(["sft", "local", "pipe", "rft"], 2) == [["sft", "local"], ["pipe", "rft"]]
    assert waves(["sft"], 8) == [["sft"]]
    with pytest.raises(GpuPlanError):
        GpuPlan(())

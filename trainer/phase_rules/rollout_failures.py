"""Failed rollouts and reward calls that stop a GRPO phase: the policy, the counts, and the cause that the error
names. (The reward service's own failure policy is ``services/reward_api/failures.py``.)

Policy, stated once (docs/training.md repeats it):

- VERL 0.9.1 runs our ``compute_score`` inside the rollout (``AgentLoopWorker._compute_score``).
  When it raises, ``AgentLoopWorkerTQ._run_prompt`` logs the error and marks the whole prompt group
  ``failure``; the failed session leaves no trajectory. In ``trainer_mode=sync`` the replay buffer
  keeps such groups sampleable and the missing samples are padded downstream; in validation they
  are left out of ``val-*/…/mean@N``. Either way the run would go on with a silently smaller batch,
  or an early-stopping score over the samples that happened to succeed.
- A sample whose reward is an infrastructure or configuration failure is masked in ``failures.mode: mask``
  (the default; :mod:`trainer.phase_rules.failure_mask`): no gradient, out of its group's baseline and out of
  the validation score. It counts as failed here, beside the failed rollouts.
- A phase stops when the failed samples pass ``failures.max_share`` (the phase configs: 0.1; 0 stops at
  the first one). In **training** the failed rollouts are counted right after VERL's replay buffer hands
  the batch over (``on_sample_end``), and with the masked samples before the advantage; both are before the
  update and before that step's checkpoint. In **validation**, the samples a validation did not score plus
  the masked ones are counted before early stopping sees its score. The error names the cause: the masked
  samples' causes, and the reward client's own error (endpoint and status, or the connection error), which
  the reward function appends to ``reward_kwargs.failure_log``, because VERL keeps the exception in the
  rollout worker's log only. Failures are counted in the metrics either way
  (``training/rollout_failure/*``, ``validation/rollout_failure/*``, ``*/masked/*``).
- A stopped phase writes ``phase_failure.json`` next to its checkpoints; ``run_phase`` reads it into
  the phase result, which says ``failed`` and exports nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainer.phase_rules.failure_mask import FailureMode, MaskPlan

FAILURE_FILE = "phase_failure.json"
Where = Literal["training", "validation"]


class FailurePolicy(BaseModel):
    """The ``failures`` block of a GRPO phase config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: FailureMode = Field(
        "mask",
        description="A sample whose reward is an infrastructure failure: 'mask' (no gradient, out of its group's "
        "baseline and of the validation score) or 'penalize' (opt-in: the service's penalty is trained on).",
    )
    max_share: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Largest share of failed (or masked) samples a training step or a validation may have.",
    )


class RolloutFailureError(RuntimeError):
    """Samples of a training step or a validation failed beyond ``failures.max_share``."""


@dataclass(frozen=True)
class FailureCount:
    where: Where
    step: int
    failed: int  # failed rollouts or unscored samples, plus the masked ones
    expected: int
    masked: int = 0

    @property
    def share(self) -> float:
        return self.failed / self.expected if self.expected else 0.0

    def as_metrics(self) -> dict[str, float]:
        return {
            f"{self.where}/rollout_failure/failed_samples": float(self.failed),
            f"{self.where}/rollout_failure/expected_samples": float(self.expected),
            f"{self.where}/rollout_failure/share": self.share,
        }


def record_reward_failure(path: str | Path, data_source: str, item_id: str, exc: BaseException) -> None:
    """Append one failed ``compute_score`` call (one JSON line; O_APPEND keeps lines whole)."""
    line = json.dumps(
        {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "pid": os.getpid(),
            "data_source": data_source,
            "id": item_id,
            "error": f"{type(exc).__name__}: {exc}",
        },
        ensure_ascii=False,
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class RewardFailureLog:
    """Reads what the reward workers appended since the last read (the cause of a failure)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.offset = self.path.stat().st_size if self.path and self.path.is_file() else 0

    def new_entries(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out


def describe_cause(entries: Iterable[Mapping[str, Any]], limit: int = 3) -> str:
    """The distinct reward errors, most frequent first, with their counts."""
    counts = Counter(str(e.get("error")) for e in entries)
    if not counts:
        return (
            "no reward error was recorded; the rollout itself failed (see 'Error in _run_prompt' in the "
            "agent-loop worker log)"
        )
    parts = [f"{err} ({n} sample{'s' if n != 1 else ''})" for err, n in counts.most_common(limit)]
    more = len(counts) - limit
    return "; ".join(parts) + (f"; and {more} other error(s)" if more > 0 else "")


def masked_cause(plan: MaskPlan, count: FailureCount, entries: list[dict[str, Any]]) -> str:
    """The cause a stop names: the masked samples' causes, and the recorded reward errors (or the failed
    rollouts' absence of one) when more failed than were masked."""
    parts = [plan.describe()]
    if entries or count.failed > plan.masked:
        parts.append(describe_cause(entries))
    return "; ".join(p for p in parts if p)


def training_failures(replay_buffer: Any, rollout_n: int, step: int, expected: int) -> FailureCount:
    """Failed samples of the batch VERL's sync ``ReplayBuffer.sample`` just selected.

    ``sample`` leaves its last TransferQueue snapshot in ``failure_keys`` (prompt groups with a
    failed session) and ``partitions`` (the trajectories, keyed ``{uid}_{session}_{index}``). A
    failed session has no trajectory, so a failed group lost ``n`` minus its sessions present.
    """
    failed_uids = set(replay_buffer.failure_keys.get("train", ()))
    sessions: dict[str, set[str]] = {}
    for key in replay_buffer.partitions.get("train", {}):
        uid, session = key.split("_")[:2]
        sessions.setdefault(uid, set()).add(session)
    failed = sum(max(1, rollout_n - len(sessions.get(uid, ()))) for uid in failed_uids)
    return FailureCount("training", step, failed, expected)


def validation_failures(step: int, scored: int, expected: int, masked: int = 0) -> FailureCount:
    """``scored`` samples came back of ``expected``; ``masked`` of them are masked (and not scored)."""
    return FailureCount("validation", step, max(0, expected - scored) + masked, expected, masked)


def with_masked(count: FailureCount, plan: MaskPlan) -> FailureCount:
    """A training step's failed rollouts plus the samples mask mode masked."""
    return FailureCount(count.where, count.step, count.failed + plan.masked, count.expected, plan.masked)


def judge(
    count: FailureCount, policy: FailurePolicy, cause: str, failure_file: Path | None
) -> RolloutFailureError | None:
    """The error to stop the phase with (its failure file written), or None within ``max_share``."""
    if count.failed == 0 or count.share <= policy.max_share:
        return None
    what = "training step" if count.where == "training" else "validation at step"
    masked = f" ({count.masked} of them masked)" if count.masked else ""
    message = (
        f"{what} {count.step}: {count.failed} of {count.expected} samples failed{masked} (share {count.share:.3f} > "
        f"failures.max_share {policy.max_share}); the phase stops instead of "
        f"{'training on a subset' if count.where == 'training' else 'scoring a subset'}. Cause: {cause}"
    )
    if failure_file is not None:
        write_failure(failure_file, count, cause, message)
    return RolloutFailureError(message)


def write_failure(path: Path, count: FailureCount, cause: str, message: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**asdict(count), "share": count.share, "cause": cause, "message": message}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def read_failure(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else None

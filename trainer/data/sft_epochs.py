"""Epochs chosen on validation for an SFT phase (A1, A2): a checkpoint and the validation loss at the end of
every epoch, and the epoch with the lowest validation loss exported.

VERL's SFT trainer validates every ``trainer.test_freq`` steps and saves every ``trainer.save_freq`` steps;
both are counts of steps, and an epoch's length in steps depends on the rows left after the length filter,
the batch size and the data-parallel size. With ``epoch_selection.enabled`` the launcher's pre-torchrun
process (``python -m trainer.data.sft_length_filter``) counts those rows and writes
``checkpoints/sft_epochs.json``: the steps per epoch and the two overrides
(``trainer.test_freq=S trainer.save_freq=S``) that the launcher adds to torchrun's command. After the run,
:func:`choose` reads ``val/loss`` from ``metrics.jsonl`` at the steps that have a checkpoint and picks the
lowest (the earlier epoch on a tie): that checkpoint is exported, and the curve and the choice go into
``phase_result.json`` (``epoch_selection``).

The rule is the validation split's loss, never a test metric. Off (the default), the phase exports its last
step as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.train_set import count_prompts

PLAN_FILE = "sft_epochs.json"
RULE = "lowest val/loss over the epochs' ends (the earlier epoch on a tie)"


class EpochPlanError(ValueError):
    """The epoch plan cannot be made (named field and reason)."""


def steps_per_epoch(rows: int, batch_size: int, dp_size: int) -> int:
    """Steps of one epoch as VERL's SFT trainer counts them: a ``DistributedSampler(drop_last=True)`` of
    ``rows // dp_size`` rows per rank, batches of ``batch_size // dp_size`` with ``drop_last=True``."""
    if dp_size < 1:
        raise EpochPlanError(f"trainer.n_gpus_per_node x trainer.nnodes: {dp_size} (must be at least 1)")
    if batch_size < 1 or batch_size % dp_size:
        raise EpochPlanError(
            f"data.train_batch_size: {batch_size} is not a positive multiple of the {dp_size} data-parallel ranks"
        )
    steps = (rows // dp_size) // (batch_size // dp_size)
    if steps < 1:
        raise EpochPlanError(f"data.train_batch_size: {batch_size} is larger than the {rows} train rows")
    return steps


@dataclass
class EpochPlan:
    rows: int
    batch_size: int
    dp_size: int
    steps_per_epoch: int
    total_epochs: int
    overrides: list[str] = field(default_factory=list)

    def write(self, ckpt_dir: Path) -> Path:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = ckpt_dir / PLAN_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def read_plan(ckpt_dir: Path) -> EpochPlan | None:
    try:
        return EpochPlan(**json.loads((ckpt_dir / PLAN_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def plan(config: Any, train_rows: int) -> EpochPlan | None:
    """The plan for a composed SFT config whose train files hold ``train_rows`` rows (after the length
    filter); None where ``epoch_selection.enabled`` is off."""
    block = config.get("epoch_selection") or {}
    if not block.get("enabled", False):
        return None
    cap = int(config.data.get("train_max_samples", -1) or -1)
    rows = min(train_rows, cap) if cap > 0 else train_rows
    dp = int(config.trainer.n_gpus_per_node) * int(config.trainer.get("nnodes", 1) or 1)
    steps = steps_per_epoch(rows, int(config.data.train_batch_size), dp)
    if not config.data.get("val_files"):
        raise EpochPlanError("data.val_files: epoch_selection needs a validation split to choose on")
    return EpochPlan(
        rows=rows,
        batch_size=int(config.data.train_batch_size),
        dp_size=dp,
        steps_per_epoch=steps,
        total_epochs=int(config.trainer.total_epochs),
        overrides=[f"trainer.test_freq={steps}", f"trainer.save_freq={steps}"],
    )


def write_plan(config: Any, ckpt_dir: Path, kept_train_rows: int | None) -> EpochPlan | None:
    """:func:`plan` for the config (train rows counted from its files where the length filter did not count
    them), written to ``ckpt_dir``; a stale plan is removed where the selection is off."""
    (ckpt_dir / PLAN_FILE).unlink(missing_ok=True)
    rows = kept_train_rows if kept_train_rows is not None else count_prompts(config.data.train_files)
    p = plan(config, rows)
    if p is not None:
        p.write(ckpt_dir)
    return p


@dataclass
class EpochChoice:
    rule: str
    steps_per_epoch: int
    # every epoch's end that has both a checkpoint and a validation loss: {"epoch", "step", "val_loss"}
    curve: list[dict[str, Any]]
    chosen_step: int
    chosen_epoch: float
    chosen_val_loss: float


def choose(
    metrics: Sequence[Mapping[str, Any]], checkpoint_steps: Sequence[int], epoch_steps: int
) -> EpochChoice | None:
    """The checkpoint with the lowest ``val/loss`` (VERL's file-logger lines ``{"step", "data"}``); None where
    no checkpoint step has a finite validation loss."""
    losses: dict[int, float] = {}
    for m in metrics:
        value = m.get("data", {}).get("val/loss")
        if isinstance(value, int | float) and math.isfinite(value):
            losses[int(m["step"])] = float(value)
    curve: list[dict[str, Any]] = [
        {"epoch": round(step / epoch_steps, 3), "step": step, "val_loss": losses[step]}
        for step in sorted(checkpoint_steps)
        if step in losses
    ]
    if not curve:
        return None
    best = min(curve, key=lambda c: (c["val_loss"], c["step"]))
    return EpochChoice(
        rule=RULE,
        steps_per_epoch=epoch_steps,
        curve=curve,
        chosen_step=int(best["step"]),
        chosen_epoch=float(best["epoch"]),
        chosen_val_loss=float(best["val_loss"]),
    )

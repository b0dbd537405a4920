"""Mask mode: a sample whose reward is an infrastructure or configuration failure is never trained on.

Policy, stated once (docs/reliability.md lists the causes with their handling):

- The reward function marks such a sample (``trainer/in_verl/reward_batcher.py``): ``score`` 0, ``masked`` = 1
  and one cause = 1, from :data:`FAILURE_CAUSES`: the executor failed after the service's retries
  (``executor_failed``), stopped at its token limit (``executor_truncated``), the document plus the schema do
  not fit its context (``prompt_too_long``), the reward service itself failed after the client's retries
  (``reward_call_failed``), or it answered a reward that is not a finite number (``reward_not_finite``) or lies
  outside the range the request's config declares (``reward_out_of_range``).
- **Training**: before the advantage, :class:`~trainer.in_verl.phase_trainer.PhaseTrainer` zeroes the
  response and loss masks of the masked samples, and of the other samples of a group left with fewer than
  two valid ones (VERL's own no-op padding is a zero mask too). The advantage estimator ``grpo_masked``
  (``trainer/in_verl/advantages.py``) leaves zero-mask rows out of their group's mean and std and gives them
  advantage 0: the valid samples get exactly the advantages they would get without the failed ones. A
  masked sample's score 0 still shows in VERL's reward metrics (``critic/score/*``); ``training/masked/*``
  says how many there were.
- **Validation**: masked samples are left out of every validation metric, so out of early stopping's score.
- Counted per step and per validation, per cause (``training/masked/<cause>``, ``validation/masked/<cause>``,
  ``…/masked/share``, ``training/masked/dropped_groups``), and in the phase's ``rollout_failure`` counts;
  the phase stops, the cause named, when failed rollouts plus masked samples pass ``failures.max_share``
  (:mod:`trainer.phase_rules.rollout_failures`). ``max_share: 0`` stops at the first one.
- ``failures.mode: penalize`` (opt-in) trains on the service's penalty instead, as its name says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FailureMode = Literal["mask", "penalize"]
# The causes the reward service names in a result's ``error``.
SERVICE_CAUSES: tuple[str, ...] = ("executor_failed", "executor_truncated", "prompt_too_long")
REWARD_NOT_FINITE = "reward_not_finite"  # the service answered NaN or ±inf
REWARD_OUT_OF_RANGE = "reward_out_of_range"  # the service answered a reward outside its config's [min, max]
# The causes of a masked sample, each a reward part key: the service's, and those the trainer's client finds.
FAILURE_CAUSES: tuple[str, ...] = (*SERVICE_CAUSES, "reward_call_failed", REWARD_NOT_FINITE, REWARD_OUT_OF_RANGE)
MASK_KEY = "masked"
UNNAMED = "unnamed"  # a sample marked masked without a cause (a reward function of the user's)


def _flag(info: Mapping[str, Any], key: str) -> bool:
    value: Any = info.get(key)
    try:
        return value is not None and float(value) != 0.0
    except (TypeError, ValueError):
        return False


def cause_of(info: Mapping[str, Any]) -> str | None:
    """The cause a masked sample's reward parts name; None for a sample that is not masked."""
    if not _flag(info, MASK_KEY):
        return None
    return next((c for c in FAILURE_CAUSES if _flag(info, c)), UNNAMED)


def group_of(key: str) -> str:
    """The prompt group (VERL's ``uid``) of a TransferQueue key ``{uid}_{session}_{index}``."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3:
        raise ValueError(f"unexpected trajectory key {key!r}: VERL's keys are '{{uid}}_{{session}}_{{index}}'")
    return parts[0]


@dataclass(frozen=True)
class MaskPlan:
    """What mask mode does to one training batch or one validation."""

    where: Literal["training", "validation"]
    samples: int  # real samples (VERL's padding left out)
    causes: dict[str, int] = field(default_factory=dict)  # masked samples per cause
    no_gradient: tuple[int, ...] = ()  # rows whose masks are zeroed: masked ones and dropped groups' others
    dropped_groups: int = 0  # groups left with fewer than two valid samples

    @property
    def masked(self) -> int:
        return sum(self.causes.values())

    @property
    def share(self) -> float:
        return self.masked / self.samples if self.samples else 0.0

    def as_metrics(self) -> dict[str, float]:
        out = {f"{self.where}/masked/{c}": float(self.causes.get(c, 0)) for c in FAILURE_CAUSES}
        if self.causes.get(UNNAMED):
            out[f"{self.where}/masked/{UNNAMED}"] = float(self.causes[UNNAMED])
        out[f"{self.where}/masked/samples"] = float(self.masked)
        out[f"{self.where}/masked/share"] = self.share
        if self.where == "training":
            out["training/masked/dropped_groups"] = float(self.dropped_groups)
            out["training/masked/no_gradient"] = float(len(self.no_gradient))
        return out

    def describe(self) -> str:
        """The causes, most frequent first (the text a stopped phase quotes)."""
        if not self.causes:
            return ""
        parts = [f"{c} ({n} sample{'s' if n != 1 else ''})" for c, n in Counter(self.causes).most_common()]
        return "masked: " + "; ".join(parts)


def plan_training_mask(
    keys: Sequence[str], infos: Sequence[Mapping[str, Any]], padding: Sequence[bool] | None = None
) -> MaskPlan:
    """The rows of a training batch that get no gradient: the masked samples, and every sample of a group left
    with fewer than two valid ones (its advantage would be its raw reward: VERL's GRPO gives a group of one
    mean 0 and std 1). ``infos`` are the samples' reward parts (``reward_extra_info``), row for row with
    ``keys``; padding rows are VERL's no-op samples, already without gradient, and are not counted."""
    if len(keys) != len(infos) or (padding is not None and len(padding) != len(keys)):
        raise ValueError(f"{len(keys)} keys, {len(infos)} reward infos and {len(padding or keys)} padding flags")
    pad = list(padding) if padding is not None else [False] * len(keys)
    causes: Counter[str] = Counter()
    valid: Counter[str] = Counter()
    masked_rows = set()
    for row, (key, info) in enumerate(zip(keys, infos, strict=True)):
        if pad[row]:
            continue
        cause = cause_of(info)
        if cause is None:
            valid[group_of(key)] += 1
        else:
            causes[cause] += 1
            masked_rows.add(row)
    touched = {group_of(keys[r]) for r in masked_rows}
    dropped = {g for g in touched if valid[g] < 2}
    rows = tuple(r for r in range(len(keys)) if not pad[r] and (r in masked_rows or group_of(keys[r]) in dropped))
    return MaskPlan("training", sum(not p for p in pad), dict(causes), rows, len(dropped))


def split_validation(infos: Mapping[str, Sequence[Any]], n: int) -> tuple[list[int], MaskPlan]:
    """The samples a validation scores (row numbers) and what it left out. ``infos`` is VERL's
    ``reward_extra_infos_dict`` (a list per reward part, ``n`` rows)."""
    flags = infos.get(MASK_KEY)
    if flags is None:
        return list(range(n)), MaskPlan("validation", n)
    causes: Counter[str] = Counter()
    keep = []
    for row in range(n):
        info = {k: v[row] for k, v in infos.items() if k == MASK_KEY or k in FAILURE_CAUSES}
        cause = cause_of(info)
        if cause is None:
            keep.append(row)
        else:
            causes[cause] += 1
    return keep, MaskPlan("validation", n, dict(causes))

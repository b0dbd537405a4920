"""How many prompts a GRPO step sends to the rollout at once under dynamic sampling.

VERL's synchronous replay buffer sends ``train_batch_size`` prompts, waits for their groups, evicts the
all-equal ones (no gradient) and only then sends twice as many again: a step whose groups collapse needs
several rounds of generation, each as long as its slowest sample. :class:`GroupPrefetch` sends the expected
shortfall with the first batch instead: ``train_batch_size / informative share`` prompts, the share being a
moving average of the groups of earlier steps that had a gradient, capped at ``max_factor`` times the
batch. The buffer still refills what is missing and discards the surplus (VERL's own
``discarded_surplus_samples``); it selects the step's groups among the finished ones in an order that does
not depend on when they finished, so what is learned from a step is unchanged: more prompts are generated,
in fewer rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class GroupPrefetch:
    max_factor: float = 1.0  # 1.0: VERL's own behaviour (one batch, then refills)
    smoothing: float = 0.5  # weight of the newest step in the moving average
    informative_share: float | None = None  # None until a step was observed

    def __post_init__(self) -> None:
        if self.max_factor < 1.0:
            raise ValueError(f"replay_buffer.prefetch_max_factor must be at least 1.0, got {self.max_factor}")
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"replay_buffer.prefetch_smoothing must be in (0, 1], got {self.smoothing}")

    @property
    def enabled(self) -> bool:
        return self.max_factor > 1.0

    def first_dispatch(self, batch: int) -> int:
        """Prompts to send with the step's first batch (at least ``batch``)."""
        if not self.enabled or self.informative_share is None:
            return batch
        factor = min(self.max_factor, 1.0 / max(self.informative_share, 1e-9))
        return max(batch, math.ceil(batch * factor - 1e-9))

    def observe(self, generated_groups: int, evicted_groups: int) -> None:
        """One step's outcome: of ``generated_groups`` prompts, ``evicted_groups`` were all-equal."""
        if generated_groups <= 0:
            return
        share = max(generated_groups - evicted_groups, 0) / generated_groups
        prev = self.informative_share
        self.informative_share = share if prev is None else self.smoothing * share + (1 - self.smoothing) * prev

"""The advantage estimator of the GRPO phases, registered the way VERL registers its own
(``verl.trainer.ppo.core_algos.register_adv_est``): ``algorithm.adv_estimator: grpo_masked``.

``grpo_masked`` is VERL's GRPO outcome advantage (``compute_grpo_outcome_advantage``, called as it is) over
the samples that have a gradient. A row whose response mask is all zero has none: a sample of mask mode
(:mod:`trainer.phases.failure_mask`, whose masks :class:`~trainer.in_verl.phase_trainer.PhaseTrainer` zeroed)
or VERL's no-op padding. Such a row is out of its group's mean and std and gets advantage 0; a group left
with fewer than two rows with a gradient gets 0 throughout (VERL's GRPO would give a group of one its raw
reward, mean 0 and std 1). Where no row is masked it equals VERL's ``grpo`` exactly (a test checks both).
VERL's responses hold at least one token (the stop token), so a real sample never has an all-zero mask.

Registered under a name of its own, VERL runs it through ``compute_advantage`` for every row (the
per-session broadcast of multi-turn agent loops is ``grpo``'s only: our phases are single-turn). It runs in
the trainer process: :mod:`trainer.in_verl.verl_main` imports this module before VERL builds the trainer.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

MASKED_GRPO = "grpo_masked"


def _norm_by_std(config: Any) -> bool:
    if config is None:
        return True
    getter = getattr(config, "get", None)
    value = getter("norm_adv_by_std_in_grpo", True) if getter else getattr(config, "norm_adv_by_std_in_grpo", True)
    return bool(value)


def compute_masked_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of shape ``(bs, response_length)``; see the module's docstring."""
    has_gradient = (response_mask.sum(dim=-1) > 0).tolist()
    per_group = Counter(index[i] for i, ok in enumerate(has_gradient) if ok)
    keep = [i for i, ok in enumerate(has_gradient) if ok and per_group[index[i]] >= 2]
    advantages = torch.zeros_like(token_level_rewards)
    if keep:
        rows = torch.tensor(keep, dtype=torch.long)
        kept, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[keep],
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=_norm_by_std(config),
        )
        advantages[rows] = kept.to(advantages.dtype)
    return advantages, advantages


core_algos.register_adv_est(MASKED_GRPO)(compute_masked_grpo_advantage)

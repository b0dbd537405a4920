"""The advantage estimators of the GRPO phases, registered the way VERL registers its own
(``verl.trainer.ppo.core_algos.register_adv_est``): ``algorithm.adv_estimator: grpo_masked`` (the default) or
``greedy_baseline`` (self-critical: a sample's reward minus its prompt's greedy reward, below).

``grpo_masked`` is VERL's GRPO outcome advantage (``compute_grpo_outcome_advantage``, called as it is) over
the samples that have a gradient. A row whose response mask is all zero has none: a sample of mask mode
(:mod:`trainer.phase_rules.failure_mask`, whose masks :class:`~trainer.in_verl.phase_trainer.PhaseTrainer` zeroed)
or VERL's no-op padding. Such a row is out of its group's mean and std and gets advantage 0; a group left
with fewer than two rows with a gradient gets 0 throughout (VERL's GRPO would give a group of one its raw
reward, mean 0 and std 1). Where no row is masked it equals VERL's ``grpo`` exactly (a test checks both).
VERL's responses hold at least one token (the stop token), so a real sample never has an all-zero mask.

Registered under a name of its own, VERL runs it through ``compute_advantage`` for every row (the
per-session broadcast of multi-turn agent loops is ``grpo``'s only: our phases are single-turn). It runs in
the trainer process: :mod:`trainer.in_verl.verl_main` imports this module before VERL builds the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
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


def rows_with_gradient(response_mask: torch.Tensor, index: np.ndarray) -> dict[Any, list[int]]:
    """Each group's rows that have a gradient (a response mask not all zero), in row order."""
    groups: dict[Any, list[int]] = {}
    for i, ok in enumerate((response_mask.sum(dim=-1) > 0).tolist()):
        if ok:
            groups.setdefault(index[i], []).append(i)
    return groups


def compute_masked_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of shape ``(bs, response_length)``; see the module's docstring."""
    keep = [i for rows in rows_with_gradient(response_mask, index).values() if len(rows) >= 2 for i in rows]
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


# ---- greedy baseline (SCST / ReMax) ---------------------------------------------------------------------

GREEDY_BASELINE = "greedy_baseline"
# uid → the reward of the policy's greedy answer to that prompt (None: it has none, e.g. its reward was
# masked); set by PhaseTrainer around VERL's advantage computation of one step (:func:`greedy_baselines`).
_baselines: dict[str, float | None] | None = None


@contextlib.contextmanager
def greedy_baselines(rewards: Mapping[str, float | None]) -> Iterator[None]:
    """The greedy rewards of the step's prompts, for ``greedy_baseline`` while VERL computes the advantages."""
    global _baselines
    _baselines = dict(rewards)
    try:
        yield
    finally:
        _baselines = None


def compute_greedy_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-critical advantages (SCST; ReMax's baseline): a sample's reward minus the reward of the policy's
    greedy answer to its prompt, so only samples that beat the greedy answer are pushed up and the ones below it
    down (GRPO's group mean rewards any sample above a mean that sampling drags below the greedy answer).

    As ``grpo_masked``: a row with an all-zero response mask is out (advantage 0); a prompt without a greedy
    reward (masked, or missing) gets 0 throughout. With ``norm_adv_by_std_in_grpo`` the differences are divided
    by the standard deviation of the group's rewards (groups of two or more)."""
    if _baselines is None:
        raise RuntimeError(
            f"algorithm.adv_estimator={GREEDY_BASELINE} needs the greedy rewards PhaseTrainer computes for each step "
            "(trainer/in_verl/phase_trainer.py); VERL's own trainer does not"
        )
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(token_level_rewards)
    scale = _norm_by_std(config)
    for uid, rows in rows_with_gradient(response_mask, index).items():
        base = _baselines.get(str(uid))
        if base is None:
            continue
        values = scores[rows] - float(base)
        if scale and len(rows) > 1:
            values = values / (torch.std(scores[rows]) + epsilon)
        advantages[rows] = values.unsqueeze(-1).to(advantages.dtype) * response_mask[rows].to(advantages.dtype)
    return advantages, advantages


core_algos.register_adv_est(GREEDY_BASELINE)(compute_greedy_baseline_advantage)

"""The greedy answers of a step's prompts and their rewards: the baseline of ``algorithm.adv_estimator:
greedy_baseline`` (:mod:`trainer.in_verl.advantages`).

:class:`~trainer.in_verl.phase_trainer.PhaseTrainer` calls :func:`greedy_rewards` once a step, right after
VERL's replay buffer hands over the batch and before the rollout replicas sleep (``on_sample_end``): the
replicas still hold the weights that wrote the step's samples. Each prompt (one per group) is generated once
at temperature 0 through VERL's own rollout client, decoded as VERL's reward manager decodes a response, and
scored by the phase's reward function (``reward_fn.compute_score`` with the phase's ``reward_kwargs``: the same
client, service and failure mode as the samples). A greedy answer whose reward is masked (an infrastructure
failure) or whose generation or reward call raised gives its prompt no baseline: that group gets no gradient
this step, and :class:`GreedyRewards` counts it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.phase_rules.failure_mask import cause_of

# What the rollout's sampling params are for a greedy answer (VERL's ``apply_greedy_sampling_params``).
GREEDY_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}


@dataclass(frozen=True)
class GreedyPrompt:
    """One prompt group of a step: its uid, the prompt's token ids and what its reward needs."""

    uid: str
    prompt_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class GreedyRewards:
    """uid → the greedy answer's reward (None: no baseline), and what went wrong where it has none."""

    rewards: dict[str, float | None] = field(default_factory=dict)
    masked: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        scored = [r for r in self.rewards.values() if r is not None]
        out = {
            "training/greedy_baseline/prompts": float(len(self.rewards)),
            "training/greedy_baseline/without_baseline": float(len(self.rewards) - len(scored)),
            "training/greedy_baseline/masked": float(self.masked),
            "training/greedy_baseline/errors": float(len(self.errors)),
            "timing_s/greedy_baseline": self.seconds,
        }
        if scored:
            out["training/greedy_baseline/reward_mean"] = sum(scored) / len(scored)
        return out


Generate = Callable[[str, list[int]], Awaitable[list[int]]]
Score = Callable[[str, str, Any, dict[str, Any]], Awaitable[Mapping[str, float]]]


async def greedy_rewards(
    prompts: Sequence[GreedyPrompt],
    generate: Generate,
    decode: Callable[[list[int]], str],
    score: Score,
    max_tokens: int,
) -> GreedyRewards:
    """Each prompt's greedy answer (``generate``: uid, prompt ids → response ids), decoded and scored (``score``:
    the phase's reward function), all at once."""
    out = GreedyRewards()
    t0 = time.monotonic()

    async def one(p: GreedyPrompt) -> float | None:
        ids = await generate(p.uid, p.prompt_ids)
        parts = await score(p.data_source, decode(list(ids)[:max_tokens]), p.ground_truth, p.extra_info)
        if cause_of(parts) is not None:
            out.masked += 1
            return None
        return float(parts["score"])

    results = await asyncio.gather(*(one(p) for p in prompts), return_exceptions=True)
    for p, r in zip(prompts, results, strict=True):
        if isinstance(r, BaseException):
            out.errors.append(f"{p.uid}: {type(r).__name__}: {r}")
            out.rewards[p.uid] = None
        else:
            out.rewards[p.uid] = r
    out.seconds = time.monotonic() - t0
    return out

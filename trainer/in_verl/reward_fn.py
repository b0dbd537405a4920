"""VERL custom reward function: a thin batched client of the reward API (docs/trainer.md).

Point VERL 0.9 at this file with the ``reward.*`` keys (the old top-level
``custom_reward_function.*`` keys are silently ignored by ``main_ppo``)::

    reward.custom_reward_function.path=trainer/in_verl/reward_fn.py
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.max_batch=64

VERL calls ``compute_score`` once per sample, concurrently on one event loop per reward worker;
:mod:`trainer.in_verl.reward_batcher` coalesces those calls into batched POSTs, enforces the deadline and
the retries, and raises rather than invent a score (its docstring states the failure policy).
The endpoint is chosen by the reward kind of ``data_source`` ("schema", "table" or "pipeline", optionally
tagged with the golden source, "table:wikitabletext": see :mod:`trainer.registry.data_source`).

When the call fails, the error is appended to ``reward_kwargs.failure_log`` (if set). In ``mask`` mode
(``failure_mode``, the phase's ``failures.mode``) a failed call of the reward service
(:class:`~trainer.in_verl.reward_batcher.RewardServiceError`: unreachable, 5xx or 429 after the retries, past
its deadline) becomes a masked sample with cause ``reward_call_failed``, and an answer whose reward is not finite
or outside its declared range one with cause ``reward_not_finite`` / ``reward_out_of_range``; any other error (a
request the service refused with a 4xx, a bad config or ground truth, a reward API serving other prompts than the
data's ``extra_info.prompt_version``: a bug, never the policy's mistake either) and
every error in ``penalize`` mode (an impossible reward included) is re-raised.
VERL then marks the prompt group ``failure`` and keeps the exception in the rollout worker's log only;
the phase's trainer reads the failure log to name the cause when it stops the phase
(:mod:`trainer.phase_rules.rollout_failures`).
"""

from __future__ import annotations

from typing import Any

from trainer.in_verl.reward_batcher import (
    RewardRequestError,
    RewardServiceError,
    cached_client_config,
    masked_score,
    score_one,
)
from trainer.phase_rules.rollout_failures import record_reward_failure
from trainer.registry.data_source import reward_kind


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """``{"score", ...parts}`` for one sample; the part keys are fixed per ``data_source``.

    ``kwargs`` are VERL's ``reward_kwargs`` (url, timeout_s, max_batch, max_wait_ms, max_attempts,
    failure_mode, schema_config / table_config / pipeline_config); ``url`` falls back to
    ``TRAINER_REWARD_URL``, and the token is ``TRAINER_REWARD_TOKEN`` only (the launcher sets both);
    ``failure_log`` is the file a failed call is recorded in before it re-raises.
    """
    failure_log = kwargs.pop("failure_log", None)
    item_id = str((extra_info or {}).get("id") or (extra_info or {}).get("index") or "sample")
    cfg = None
    try:
        cfg = cached_client_config(kwargs)  # built once per worker process for the same kwargs
        version = (extra_info or {}).get("prompt_version")  # the prompts the sample's data was built with
        return await score_one(str(data_source), solution_str, ground_truth, cfg, item_id, version or None)
    except Exception as exc:
        if failure_log:
            record_reward_failure(str(failure_log), str(data_source), item_id, exc)
        infra = isinstance(exc, RewardServiceError) and not isinstance(exc, RewardRequestError)
        if cfg is not None and cfg.failure_mode == "mask" and infra:
            return masked_score(reward_kind(str(data_source)), "reward_call_failed")
        raise

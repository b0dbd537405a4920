"""VERL custom reward function: a thin batched client of the reward API (DESIGN §4.5).

Point VERL 0.9 at this file with the ``reward.*`` keys (the old top-level
``custom_reward_function.*`` keys are silently ignored by ``main_ppo``)::

    reward.custom_reward_function.path=trainer/reward_fn.py
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.max_batch=64

VERL calls ``compute_score`` once per sample, concurrently on one event loop per reward worker;
:mod:`trainer.reward_client` coalesces those calls into batched POSTs, enforces the deadline and
the retries, and raises rather than invent a score (its docstring states the failure policy).
The endpoint is chosen by ``data_source`` ("schema", "table" or "pipeline").
"""

from __future__ import annotations

from typing import Any

from trainer.reward_client import client_config_from_kwargs, score_one


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """``{"score", ...parts}`` for one sample; the part keys are fixed per ``data_source``.

    ``kwargs`` are VERL's ``reward_kwargs`` (url, token, timeout_s, max_batch, max_wait_ms,
    max_attempts, on_executor_error, schema_config / table_config / pipeline_config); ``url`` and
    ``token`` fall back to ``REWARD_API_URL`` / ``REWARD_API_TOKEN``.
    """
    cfg = client_config_from_kwargs(kwargs)
    item_id = str((extra_info or {}).get("id") or (extra_info or {}).get("index") or "sample")
    return await score_one(str(data_source), solution_str, ground_truth, cfg, item_id)

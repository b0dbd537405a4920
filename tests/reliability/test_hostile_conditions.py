"""Hostile and unlucky conditions: memory and CPU bombs, slow clients, orphaned work, retry storms and
leaks, tried on a real reward_api. Fault executors are ``FaultyExecutor`` fault injectors.

Scale: the full run (``python -m bench reliability``) opens 1,000 idle sockets and sends the largest
legal bodies; the CI run scales the socket count down.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import GoldenExample, canonical_schema_json
from tests.helpers.faulty_executor import FaultyExecutor
from tests.helpers.servers import RewardApiServer
from tests.reliability.conftest import Scale

pytestmark = [pytest.mark.service]

JSON = {"content-type": "application/json"}


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _pipe_items(ex: GoldenExample, n: int) -> list[dict[str, Any]]:
    base = {"gold_schema": ex.schema_dict(), "gold_table": ex.table_dict()}
    pred = canonical_schema_json(ex.schema_dict())
    return [{"id": f"p{i}", "prediction": pred, "text": f"{ex.text} ({i})", **base} for i in range(n)]


def test_memory_bomb_is_refused_and_rss_stays_bounded(record_property: Any) -> None:
    """An 8 MiB body of 1.2 M one-cell gold rows (legal before: RSS 132 → 933 MiB), then the largest legal
    request by cells (MAX_CELLS_PER_REQUEST one-cell rows over 1,024 items)."""
    head = b'{"items": [{"id": "x", "prediction": "", "gold_table": {"columns": [{"name": "c"}], "data": ['
    bomb = head + b",".join([b'["v"]'] * 1_300_000) + b"]}}]}"  # 7.4 MiB: under the 8 MiB body limit
    legal = {
        "items": [
            {
                "id": f"t{i}",
                "prediction": '{"c": "v"}',
                "gold_table": {"columns": [{"name": "c"}], "data": [["v"]] * 256},
            }
            for i in range(1024)
        ]
    }
    with RewardApiServer({"REWARD_API_LOG_LEVEL": "WARNING"}) as api:
        before = _peak_rss_mib(api.pid)
        r1 = httpx.post(f"{api.url}/reward/table", content=bomb, headers=JSON, timeout=120)
        after_bomb = _peak_rss_mib(api.pid)
        r2 = httpx.post(f"{api.url}/reward/table", json=legal, timeout=300)
        after_legal = _peak_rss_mib(api.pid)
    record_property("expected", "bomb: 413 (item_too_large or body_too_large); legal: 200; peak RSS +< 600 MiB")
    record_property(
        "observed",
        f"bomb {len(bomb) / 2**20:.1f} MiB: {r1.status_code} {r1.json().get('error')}; legal 262,144 cells: "
        f"{r2.status_code}; peak RSS {before:.0f} → {after_bomb:.0f} → {after_legal:.0f} MiB",
    )
    assert r1.status_code == 413 and r2.status_code == 200
    assert after_legal - before < 600


def test_cpu_bomb_is_refused_before_scoring(record_property: Any) -> None:
    """2,000 × 2,000 rows from a small body (the Hungarian alignment cost 14 s of CPU before)."""
    gold = {"columns": [{"name": "c"}], "data": [[str(i)] for i in range(2000)]}
    pred = "\n".join(json.dumps({"c": str(i)}) for i in reversed(range(2000)))
    body = {"items": [{"id": "x", "prediction": pred, "gold_table": gold}]}
    with RewardApiServer({"REWARD_API_LOG_LEVEL": "WARNING"}) as api:
        t0 = time.monotonic()
        r = httpx.post(f"{api.url}/reward/table", json=body, timeout=120)
        elapsed = time.monotonic() - t0
    size = len(json.dumps(body)) / 1024
    record_property("expected", "413 item_too_large naming items[0].gold_table.data, in well under a second")
    record_property("observed", f"{size:.0f} KiB body: {r.status_code} {r.json().get('error')} in {elapsed:.2f} s")
    assert r.status_code == 413 and r.json()["detail"][0]["field"] == "items[0].gold_table.data"
    assert elapsed < 2.0


def test_idle_sockets_are_closed(scale: Scale, record_property: Any) -> None:
    """Idle sockets and partial headers (1,000 at full scale) held connections open for 81 s before."""
    n = 1000 if scale.full else 100
    env = {"REWARD_API_HEADER_TIMEOUT_S": "2", "REWARD_API_LOG_LEVEL": "WARNING"}
    with RewardApiServer(env) as api:
        socks = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", api.port))
            if i % 2:
                s.sendall(b"POST /reward/table HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(s)
        t0 = time.monotonic()
        closed = 0
        for s in socks:
            s.settimeout(max(0.1, 15 - (time.monotonic() - t0)))
            try:
                closed += s.recv(64) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                continue
            s.close()
        elapsed = time.monotonic() - t0
        ok = httpx.get(f"{api.url}/healthz", timeout=10).status_code
    record_property("expected", f"all {n} closed by the server within HEADER_TIMEOUT_S (2 s) + margin; then 200")
    record_property("observed", f"{closed}/{n} closed in {elapsed:.1f} s; /healthz then {ok}")
    assert closed == n and elapsed < 10 and ok == 200


def test_orphaned_calls_are_cancelled(examples: list[GoldenExample], record_property: Any) -> None:
    """A client that disconnects after 1 s from a 40-item pipeline request (all 40 executor calls ran before)."""
    items = _pipe_items(examples[0], 40)
    with FaultyExecutor("ok", content="{}", delay_s=0.5) as fx:
        env = {"REWARD_API_EXECUTOR_URLS": fx.url, "REWARD_API_MAX_IN_FLIGHT": "2", "REWARD_API_LOG_LEVEL": "WARNING"}
        with RewardApiServer(env) as api:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=1.0)
            time.sleep(6.0)
            calls = fx.calls
    record_property("expected", "executor calls stop once the client is gone (≤ 8 of 40)")
    record_property("observed", f"{calls} of 40 executor calls made")
    assert calls <= 8


def test_no_retry_storm_end_to_end(examples: list[GoldenExample], record_property: Any) -> None:
    """One sample through the trainer's client against an executor answering 503 (12 attempts before)."""
    from trainer.in_verl.reward_batcher import RewardClientConfig, RewardServiceError, score_one

    ex = examples[1]
    gt = {"text": ex.text, "schema": ex.schema_dict(), "table": ex.table_dict()}
    with FaultyExecutor("http_500") as fx:
        env = {
            "REWARD_API_EXECUTOR_URLS": fx.url,
            "REWARD_API_RETRIES": "2",
            "REWARD_API_RETRY_BACKOFF_S": "0.05",
            "REWARD_API_LOG_LEVEL": "WARNING",
        }
        with RewardApiServer(env) as api:
            cfg = RewardClientConfig(url=api.url, max_attempts=4, backoff_s=0.05)

            async def go() -> str:
                try:
                    parts = await score_one("pipeline", canonical_schema_json(ex.schema_dict()), json.dumps(gt), cfg)
                except RewardServiceError as exc:
                    return str(exc)[:80]
                return "masked executor_failed" if parts["masked"] and parts["executor_failed"] else "scored"

            with ThreadPoolExecutor(1) as pool:
                outcome = pool.submit(asyncio.run, go()).result(timeout=120)
            attempts = fx.calls
    record_property(
        "expected", "a masked sample (executor_failed, mask mode); executor attempts = service tries only (3)"
    )
    record_property("observed", f"{outcome!r}; {attempts} executor attempts")
    assert outcome == "masked executor_failed" and attempts == 3


def test_redirect_and_error_text_do_not_leak(examples: list[GoldenExample], record_property: Any) -> None:
    """A 307 from the executor to another local service (followed before; its body came back in the 503)."""
    items = _pipe_items(examples[2], 1)
    with (
        FaultyExecutor("ok", content="INTERNAL-SERVICE-BODY") as other,
        FaultyExecutor("redirect", redirect_to=f"{other.url}/v1/chat/completions") as fx,
    ):
        env = {"REWARD_API_EXECUTOR_URLS": fx.url, "REWARD_API_LOG_LEVEL": "WARNING"}
        with RewardApiServer(env) as api:
            r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=60)
            log = api.log_path.read_text(errors="replace")
    leaks = [s for s in ("INTERNAL-SERVICE-BODY", str(other.port), str(fx.port)) if s in r.text or s in log]
    record_property("expected", "503 executor_bad_response; the other service never called; no body or address")
    record_property("observed", f"{r.status_code} {r.json().get('error')}; other called {other.calls}×; leaks {leaks}")
    assert r.status_code == 503 and other.calls == 0 and not leaks


def test_request_slots_answer_429(examples: list[GoldenExample], record_property: Any) -> None:
    """More concurrent pipeline requests than MAX_CONCURRENT_REQUESTS (2), slots held by a slow executor."""
    with FaultyExecutor("ok", content="{}", delay_s=3.0) as fx:
        env = {
            "REWARD_API_EXECUTOR_URLS": fx.url,
            "REWARD_API_MAX_CONCURRENT_REQUESTS": "2",
            "REWARD_API_QUEUE_TIMEOUT_S": "0.5",
            "REWARD_API_LOG_LEVEL": "WARNING",
        }
        with RewardApiServer(env) as api:

            def one(i: int) -> int:
                body = {"items": _pipe_items(examples[3 + i], 1)}
                return httpx.post(f"{api.url}/reward/pipeline", json=body, timeout=30).status_code

            with ThreadPoolExecutor(6) as pool:
                codes = sorted(pool.map(one, range(6)))
    record_property("expected", "2 × 200, the other 4 × 429 too_many_requests (Retry-After)")
    record_property("observed", f"status codes {codes}")
    assert codes == [200, 200, 429, 429, 429, 429]


def test_in_flight_calls_are_budgeted_per_executor(examples: list[GoldenExample], record_property: Any) -> None:
    """24 prompts to 2 slow replicas, MAX_IN_FLIGHT 16, MAX_IN_FLIGHT_PER_EXECUTOR 3 (8 at each before).

    Before the per-replica budget, each replica saw 8 calls at once: the worker's 16 split by routing."""
    ex = examples[4]
    items = [
        {**_pipe_items(ex, 1)[0], "id": str(i), "text": f"{ex.text} ({i})"} for i in range(24)
    ]  # distinct prompts: no dedup
    with (
        FaultyExecutor("ok", content="{}", delay_s=0.3) as a,
        FaultyExecutor("ok", content="{}", delay_s=0.3) as b,
    ):
        env = {
            "REWARD_API_EXECUTOR_URLS": f"{a.url},{b.url}",
            "REWARD_API_MAX_IN_FLIGHT": "16",
            "REWARD_API_MAX_IN_FLIGHT_PER_EXECUTOR": "3",
            "REWARD_API_LOG_LEVEL": "WARNING",
        }
        with RewardApiServer(env) as api:
            r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=120)
            peaks = (a.max_in_flight, b.max_in_flight)
    record_property("expected", "200, 24 executor calls; at most 3 at once at each replica")
    calls = r.json().get("executor_calls")
    record_property("observed", f"{r.status_code}, {calls} calls; peaks at the replicas {peaks}")
    assert r.status_code == 200 and r.json()["executor_calls"] == 24 and peaks == (3, 3)


def test_one_models_read_for_a_cold_start(examples: list[GoldenExample], record_property: Any) -> None:
    """A cold start's first request: 50 prompts, MODEL_CHECK_S 0, a slow /v1/models (51 reads before).

    /v1/models takes 0.3 s; before the single-flight read, each prompt's length check read it again."""
    ex = examples[5]
    items = [{**_pipe_items(ex, 1)[0], "id": str(i), "text": f"{ex.text} ({i})"} for i in range(50)]
    with FaultyExecutor("ok", content="{}", models_delay_s=0.3) as fx:
        env = {"REWARD_API_EXECUTOR_URLS": fx.url, "REWARD_API_MODEL_CHECK_S": "0", "REWARD_API_LOG_LEVEL": "WARNING"}
        with RewardApiServer(env) as api:
            before = fx.models_calls  # the server's own readiness checks, if any
            r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items}, timeout=120)
            reads = fx.models_calls - before
    record_property("expected", "200; one /v1/models read for the whole request")
    record_property("observed", f"{r.status_code}; {reads} /v1/models read(s) for 50 prompts")
    assert r.status_code == 200 and reads == 1

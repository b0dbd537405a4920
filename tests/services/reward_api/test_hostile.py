"""reward_api under hostile and unlucky conditions, over HTTP against a real reward_api process.

Executors here are ``FaultyExecutor`` fault injectors (tests/helpers/faulty_executor.py): a cut answer, a
model swap behind the same name, a malformed ``/v1/models``, a redirect, a slow executor. Each test names
the finding of the issue it covers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from services.executor_vllm.vllm_server import free_port
from services.reward_api.__main__ import refuse_open_bind
from services.reward_api.process import REPO
from services.reward_api.settings import Settings
from shared import (
    GoldenExample,
    canonical_schema_json,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    pipeline_reward_for_executor_truncated,
)
from shared.rewards import PipelineSchemaRewardConfig
from tests.helpers.faulty_executor import FaultyExecutor, closed_port
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import metric, post

pytestmark = [pytest.mark.service]

QUICK = {
    "REWARD_API_RETRIES": "0",
    "REWARD_API_EXECUTOR_TIMEOUT_S": "10",
    "REWARD_API_REQUEST_DEADLINE_S": "30",
    "REWARD_API_TOKEN": "",
}


@contextmanager
def service(*urls: str, **env: str) -> Iterator[RewardApiServer]:
    with RewardApiServer(env={**QUICK, "REWARD_API_EXECUTOR_URLS": ",".join(urls), **env}) as server:
        yield server


def _pipe_item(ex: GoldenExample, item_id: str = "p", text: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id,
        "prediction": canonical_schema_json(ex.schema_dict()),
        "text": text if text is not None else ex.text,
        "gold_schema": ex.schema_dict(),
        "gold_table": ex.table_dict(),
    }


def _table_item(rows: int, cols: int = 1, item_id: str = "t") -> dict[str, Any]:
    columns = [{"name": f"c{k}"} for k in range(cols)]
    return {"id": item_id, "prediction": "", "gold_table": {"columns": columns, "data": [["v"] * cols] * rows}}


# ---- 1, 2 and "also": bounded input --------------------------------------------------------------


@pytest.fixture(scope="module")
def bounded() -> Iterator[RewardApiServer]:
    env = {"REWARD_API_EXECUTOR_URLS": "", "REWARD_API_TOKEN": "", "REWARD_API_MAX_CELLS_PER_REQUEST": "1000"}
    with RewardApiServer(env=env) as server:
        yield server


def test_defaults_bound_body_and_concurrency() -> None:
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.max_body_bytes == 8 * 1024 * 1024  # was 64 MiB: ~6 GB of decoded cells in one request
    assert s.max_rows_per_item == 256 and s.max_cells_per_request == 262_144
    assert s.max_concurrent_requests >= 1 and s.max_connections >= 1
    assert s.max_align_rows == 256


def test_rows_cells_columns_per_item_are_413_naming_the_field(bounded: RewardApiServer) -> None:
    # 2,000 × 2,000 rows from a ~54 KiB body cost 14 s of CPU in the aligner; now refused before scoring.
    big = _table_item(2000)
    big["prediction"] = "\n".join(['{"c0": "v"}'] * 2000)
    t0 = time.monotonic()
    r = post(bounded.url, "/reward/table", {"items": [_table_item(2, item_id="ok"), big]})
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"] == "item_too_large"
    assert [d["field"] for d in r.json()["detail"]] == ["items[1].gold_table.data"]
    assert time.monotonic() - t0 < 5
    wide = _table_item(1, cols=300)
    r = post(bounded.url, "/reward/table", {"items": [wide]})
    assert r.status_code == 413 and r.json()["detail"][0]["field"] == "items[0].gold_table.columns"


def test_cells_per_request_are_413(bounded: RewardApiServer) -> None:
    items = [_table_item(100, cols=2, item_id=str(i)) for i in range(6)]  # 1,200 cells > 1,000
    r = post(bounded.url, "/reward/table", {"items": items})
    assert r.status_code == 413 and r.json() == {
        "error": "too_many_cells",
        "detail": {"field": "items", "limit": 1000, "got": 1200},
    }
    assert post(bounded.url, "/reward/table", {"items": items[:5]}).status_code == 200


def test_long_id_and_column_name_are_422(bounded: RewardApiServer) -> None:
    item = _table_item(1)
    item["id"] = "x" * 5000
    item["gold_table"]["columns"] = [{"name": "n" * 300}]
    r = post(bounded.url, "/reward/table", {"items": [item]})
    assert r.status_code == 422, r.text[:300]
    assert [d["field"] for d in r.json()["detail"]] == ["items[0].id", "items[0].gold_table.columns[0].name"]
    assert "x" * 300 not in r.text  # the id is not echoed back


def test_gold_schema_columns_are_bounded_too(bounded: RewardApiServer) -> None:
    """/reward/schema (and pipeline's gold_schema): a column count over MAX_COLUMNS is 413, a column name
    over MAX_COLUMN_NAME_CHARS is 422, each naming the gold_schema field."""
    wide = {"id": "s", "prediction": "[]", "gold_schema": {"columns": [{"name": f"c{k}"} for k in range(300)]}}
    r = post(bounded.url, "/reward/schema", {"items": [wide]})
    assert r.status_code == 413 and r.json()["detail"][0]["field"] == "items[0].gold_schema.columns", r.text[:300]
    long_name = {"id": "s", "prediction": "[]", "gold_schema": {"columns": [{"name": "ok"}, {"name": "n" * 300}]}}
    r = post(bounded.url, "/reward/schema", {"items": [long_name]})
    assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == ["items[0].gold_schema.columns[1].name"]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", None],
)
def test_non_json_bodies_are_415(bounded: RewardApiServer, content_type: str | None) -> None:
    body = json.dumps({"items": [_table_item(1)]}).encode()
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(f"{bounded.url}/reward/table", content=body, headers=headers)  # bytes: no content-type added
    assert r.status_code == 415, r.text
    assert r.json()["error"] == "unsupported_media_type"


def _shuffled_rows_table() -> tuple[dict[str, Any], str]:
    """A 6-row gold table and a prediction with its rows reversed and one cell of each changed: the
    Hungarian alignment pairs every row with its gold row; a cap of 2 rows pairs most of them in order."""
    gold = {"columns": [{"name": "a"}, {"name": "b"}], "data": [[str(k), f"x{k}"] for k in range(6)]}
    prediction = "\n".join(json.dumps({"a": str(k), "b": "changed"}) for k in reversed(range(6)))
    return gold, prediction


def test_max_align_rows_reaches_the_table_metric(golden_sample: list[GoldenExample]) -> None:
    """REWARD_API_MAX_ALIGN_ROWS is passed to shared's table metric by /reward/table and /reward/pipeline:
    each answers the reward computed with that cap (which differs from the uncapped one here)."""
    gold, prediction = _shuffled_rows_table()
    capped, full = (compute_table_reward_single(prediction, gold, max_align_rows=n).reward for n in (2, 256))
    assert capped != full  # the case tells the two apart
    ex = golden_sample[9]
    item = {**_pipe_item(ex), "gold_table": gold}
    cfg = PipelineSchemaRewardConfig()
    schema = compute_schema_reward_single(item["prediction"], ex.schema_dict(), cfg.schema_reward)
    table = compute_table_reward_single(prediction, gold, cfg.table_reward, max_align_rows=2)
    with FaultyExecutor("ok", content=prediction) as fx, service(fx.url, REWARD_API_MAX_ALIGN_ROWS="2") as api:
        r = post(api.url, "/reward/table", {"items": [{"id": "t", "prediction": prediction, "gold_table": gold}]})
        assert r.status_code == 200 and r.json()["results"][0]["reward"] == capped, r.text[:300]
        r = post(api.url, "/reward/pipeline", {"items": [item]})
        assert (
            r.status_code == 200
            and r.json()["results"][0]["reward"] == combine_pipeline_reward(schema, table, cfg).reward
        ), r.text[:300]


# ---- 3: a truncated executor answer --------------------------------------------------------------


def test_truncated_answer_is_executor_truncated_not_a_wrong_answer(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[0]
    with (
        FaultyExecutor("ok", content=gold_ndjson(ex.table_dict())[:20], finish_reason="length") as fx,
        service(fx.url) as api,
    ):
        before = metric(api.url, "reward_api_failures_total", {"cls": "executor_truncated"})
        r = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]})
        after = metric(api.url, "reward_api_failures_total", {"cls": "executor_truncated"})
    assert r.status_code == 200, r.text
    body = r.json()
    res = body["results"][0]
    assert res["error"] == "executor_truncated" and body["executor_truncated"] == 1 and body["failed"] == 0
    cfg = PipelineSchemaRewardConfig()
    schema = compute_schema_reward_single(_pipe_item(ex)["prediction"], ex.schema_dict(), cfg.schema_reward)
    assert res["reward"] == pipeline_reward_for_executor_truncated(schema, ex.table_dict(), cfg).reward
    assert after == before + 1


# ---- 4: a model swap behind the same served name -------------------------------------------------


def test_model_swap_is_never_served_from_the_cache(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[1]
    with (
        FaultyExecutor("ok", content='{"a": "old model"}', root="/models/pi2-v1") as fx,
        service(fx.url, REWARD_API_MODEL_CHECK_S="0") as api,
    ):
        body = {"items": [_pipe_item(ex)], "debug": True}
        first = post(api.url, "/reward/pipeline", body).json()["results"][0]["debug"]
        fx.root, fx.content = "/models/pi2-v2", '{"a": "new model"}'
        second = post(api.url, "/reward/pipeline", body).json()["results"][0]["debug"]
        third = post(api.url, "/reward/pipeline", body).json()["results"][0]["debug"]
    assert first["executor_output"] == '{"a": "old model"}'
    assert second["executor_output"] == '{"a": "new model"}' and second["cached"] is False
    assert third["executor_output"] == '{"a": "new model"}' and third["cached"] is True


@pytest.mark.parametrize("model_check_s", ["5", "0"])
def test_one_models_read_for_many_prompts(golden_sample: list[GoldenExample], model_check_s: str) -> None:
    """The first request after a start read /v1/models once per distinct prompt (50 for 50). With
    MODEL_CHECK_S=0 ("before every request") each prompt's length check still read it again (51 for 50):
    the check now uses the limit of the read that built the request's keys."""
    ex = golden_sample[2]
    items = [_pipe_item(ex, str(i), text=f"{ex.text} ({i})") for i in range(50)]
    with FaultyExecutor("ok", content="{}") as fx, service(fx.url, REWARD_API_MODEL_CHECK_S=model_check_s) as api:
        r = post(api.url, "/reward/pipeline", {"items": items})
        assert r.status_code == 200 and r.json()["executor_calls"] == 50
        assert fx.models_calls == 1


# ---- 5: a malformed /v1/models ----------------------------------------------------------------------


def test_malformed_models_answer_is_no_500(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[3]
    with (
        FaultyExecutor("ok", content=gold_ndjson(ex.table_dict()), models_body={"data": None}) as fx,
        service(fx.url) as api,
    ):
        for mode in ("fail", "penalize"):
            r = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)], "on_executor_error": mode})
            assert r.status_code == 200, (mode, r.text)
            assert r.json()["results"][0]["error"] is None  # limit unknown: the call is made and scored
        ready = httpx.get(f"{api.url}/readyz/pipeline", timeout=10)
        assert ready.status_code == 503 and "malformed" in ready.json()["replicas"][0]["reason"]
        assert httpx.get(f"{api.url}/readyz", timeout=10).status_code == 200


# ---- 6: orphaned work, early stop, one retrying layer ------------------------------------------------


def test_calls_of_a_client_that_left_are_cancelled(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[4]
    items = [_pipe_item(ex, str(i), text=f"{ex.text} ({i})") for i in range(40)]
    with FaultyExecutor("ok", content="{}", delay_s=0.5) as fx, service(fx.url, REWARD_API_MAX_IN_FLIGHT="2") as api:
        with pytest.raises(httpx.ReadTimeout):
            post(api.url, "/reward/pipeline", {"items": items}, timeout=1.0)
        time.sleep(1.0)
        settled = fx.calls
        time.sleep(2.0)
        assert fx.calls == settled, "executor calls went on after the client left"
        assert settled <= 8  # before: all 40, 2 at a time, for 10 s after the client left
        assert metric(api.url, "reward_api_client_aborts_total", {"endpoint": "/reward/pipeline"}) == 1
        assert metric(api.url, "reward_api_requests_total", {"status": "500"}) == 0


def test_fail_mode_stops_at_the_first_failure(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[5]
    items = [_pipe_item(ex, str(i), text=f"{ex.text} ({i})") for i in range(10)]
    with FaultyExecutor("http_500", delay_s=0.2) as fx, service(fx.url, REWARD_API_MAX_IN_FLIGHT="1") as api:
        r = post(api.url, "/reward/pipeline", {"items": items})
        assert r.status_code == 503 and r.json()["detail"]["cause"] == "http_5xx"
        time.sleep(1.0)
        assert fx.calls <= 2  # before: all 10


def test_in_flight_calls_are_budgeted_per_executor_replica(golden_sample: list[GoldenExample]) -> None:
    """Budget in-flight calls per executor, not per worker: MAX_IN_FLIGHT_PER_EXECUTOR caps what each
    replica has outstanding from this process. Two slow replicas, MAX_IN_FLIGHT 16, 3 per replica, 24
    distinct prompts: each replica sees 3 at once, never more. Before: 8 each (16 split by routing)."""
    ex = golden_sample[8]
    items = [_pipe_item(ex, str(i), text=f"{ex.text} ({i})") for i in range(24)]
    env = {"REWARD_API_MAX_IN_FLIGHT": "16", "REWARD_API_MAX_IN_FLIGHT_PER_EXECUTOR": "3"}
    with (
        FaultyExecutor("ok", content="{}", delay_s=0.3) as a,
        FaultyExecutor("ok", content="{}", delay_s=0.3) as b,
        service(a.url, b.url, **env) as api,
    ):
        r = post(api.url, "/reward/pipeline", {"items": items})
        assert r.status_code == 200 and r.json()["executor_calls"] == 24, r.text[:300]
        assert (a.max_in_flight, b.max_in_flight) == (3, 3)
        info = httpx.get(f"{api.url}/info", timeout=10).json()
    assert info["limits"]["max_in_flight_per_executor"] == 3 and info["limits"]["max_in_flight"] == 16


# ---- 7: redirects, and what reaches the client ----------------------------------------------------


def test_redirect_is_not_followed_and_nothing_leaks(golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[6]
    with FaultyExecutor("ok", content="SECRET-INTERNAL-BODY") as other:
        with FaultyExecutor("redirect", redirect_to=f"{other.url}/v1/chat/completions") as fx, service(fx.url) as api:
            r = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]})
            assert r.status_code == 503 and r.json()["error"] == "executor_bad_response", r.text
            assert other.calls == 0
            assert "SECRET" not in r.text and str(fx.port) not in r.text and str(other.port) not in r.text
        with FaultyExecutor("http_500") as fx, service(fx.url) as api:
            r = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]})
            assert r.status_code == 503 and "injected 500" not in r.text and str(fx.port) not in r.text
        with closed_port() as dead, service(f"http://127.0.0.1:{dead}") as api:
            r = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]})
            assert r.status_code == 503 and str(dead) not in r.text


# ---- 8: slow clients --------------------------------------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_and_partial_headers_are_closed_and_slow_bodies_get_408() -> None:
    env = {"REWARD_API_HEADER_TIMEOUT_S": "1", "REWARD_API_BODY_TIMEOUT_S": "1"}
    with service(**env) as api:
        idle = socket.create_connection(("127.0.0.1", api.port))
        partial = socket.create_connection(("127.0.0.1", api.port))
        partial.sendall(b"POST /reward/table HTTP/1.1\r\nHost: x\r\n")
        assert _closed_within(idle, 5) and _closed_within(partial, 5)
        slow = socket.create_connection(("127.0.0.1", api.port))
        slow.sendall(
            b"POST /reward/table HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"items": ['
        )
        slow.settimeout(5)
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        for s in (idle, partial, slow):
            s.close()
        assert metric(api.url, "reward_api_slow_client_timeouts_total", {"phase": "headers"}) >= 2


def test_connection_cap() -> None:
    with service(REWARD_API_MAX_CONNECTIONS="4", REWARD_API_HEADER_TIMEOUT_S="30") as api:
        held = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(4)]
        time.sleep(0.3)
        try:
            assert httpx.get(f"{api.url}/healthz", timeout=5).status_code == 503
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        assert httpx.get(f"{api.url}/healthz", timeout=5).status_code == 200


def test_abort_mid_body_is_an_abort_not_a_500() -> None:
    with service() as api:
        sock = socket.create_connection(("127.0.0.1", api.port))
        sock.sendall(
            b"POST /reward/table HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"items": ['
        )
        time.sleep(0.3)
        sock.close()
        time.sleep(0.5)
        assert metric(api.url, "reward_api_client_aborts_total", {"endpoint": "/reward/table"}) == 1
        assert metric(api.url, "reward_api_requests_total", {"status": "500"}) == 0
        assert metric(api.url, "reward_api_failures_total", {"cls": "internal"}) == 0


# ---- also: graceful shutdown ----------------------------------------------------------------------


@pytest.mark.parametrize(("grace", "drained"), [("330", True), ("1", False)])
def test_sigterm_drains_running_requests_within_the_grace(
    golden_sample: list[GoldenExample], grace: str, drained: bool
) -> None:
    """A scale-down (SIGTERM) lets a running pipeline request finish within SHUTDOWN_GRACE_S (the default
    330 s covers REQUEST_DEADLINE_S): it is answered 200, then the process exits. With a 1 s grace the
    same 4 s request is cut, so the grace is what drains it."""
    ex = golden_sample[10]
    with (
        FaultyExecutor("ok", content=gold_ndjson(ex.table_dict()), delay_s=4.0) as fx,
        service(fx.url, REWARD_API_SHUTDOWN_GRACE_S=grace) as api,
        ThreadPoolExecutor(1) as pool,
    ):
        running = pool.submit(post, api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]}, 60.0)
        fx.wait_in_flight(1)
        os.kill(api.pid, signal.SIGTERM)  # the process this test started; the pod's SIGTERM
        try:
            answer: httpx.Response | None = running.result(timeout=60)
        except httpx.HTTPError:
            answer = None
        assert api.proc is not None
        assert api.proc.wait(timeout=30) is not None  # it exits once drained (or cut)
    if drained:
        assert answer is not None and answer.status_code == 200, answer
        assert answer.json()["results"][0]["error"] is None
    else:
        assert answer is None or answer.status_code != 200


# ---- 9: fail closed without a token ------------------------------------------------------------------


def test_open_bind_without_token_is_refused() -> None:
    no_token = Settings(token="", _env_file=None)  # type: ignore[call-arg]  # an empty Secret value
    assert no_token.token is None
    assert refuse_open_bind("0.0.0.0", no_token, insecure=False)
    assert refuse_open_bind("10.1.2.3", no_token, insecure=False)
    assert refuse_open_bind("127.0.0.1", no_token, insecure=False) is None
    assert refuse_open_bind("::1", no_token, insecure=False) is None
    assert refuse_open_bind("0.0.0.0", no_token, insecure=True) is None
    assert refuse_open_bind("0.0.0.0", Settings(token="t", _env_file=None), insecure=False) is None  # type: ignore[call-arg]
    env = {"PATH": "/usr/bin:/bin", "REWARD_API_TOKEN": "", "REWARD_API_EXECUTOR_URLS": ""}
    cmd = [sys.executable, "-m", "services.reward_api", "--host", "0.0.0.0", "--port", str(free_port())]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "REWARD_API_TOKEN" in done.stderr


# ---- 10: readiness -----------------------------------------------------------------------------------


def test_local_readiness_does_not_wait_on_the_executor() -> None:
    with closed_port() as dead, service(f"http://127.0.0.1:{dead}") as api:
        r = httpx.get(f"{api.url}/readyz", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ready"
        assert httpx.get(f"{api.url}/readyz/pipeline", timeout=10).status_code == 503


def test_a_replica_whose_generation_hangs_is_not_ready(golden_sample: list[GoldenExample]) -> None:
    """``/v1/models`` answers but generation hangs: /readyz/pipeline asks for one token and says not ready,
    naming the cause; a replica that generated recently is trusted without asking, within the window."""
    ex = golden_sample[2]
    # 3 s: /v1/models shares the timeout and must answer within it on a loaded 2-core machine; the hang (30 s)
    # outlasts it, and under two timeouts' time proves one generation probe, not a retry
    env = {"REWARD_API_READY_TIMEOUT_S": "3"}
    with FaultyExecutor("hang", hang_s=30, content=gold_ndjson(ex.table_dict())) as fx, service(fx.url, **env) as api:
        t0 = time.monotonic()
        r = httpx.get(f"{api.url}/readyz/pipeline", timeout=20)
        assert r.status_code == 503, r.text
        assert r.json()["replicas"][0]["reason"] == "generation: no token within 3.0 s"
        assert time.monotonic() - t0 < 6 and fx.models_calls >= 1 and fx.calls == 1  # one probe
        fx.mode = "ok"
        r = httpx.get(f"{api.url}/readyz/pipeline", timeout=10)
        assert r.status_code == 200 and r.json()["replicas"][0]["ready"] is True, r.text
        probe = fx.requests[-1]
        assert probe["max_tokens"] == 1 and probe["model"] == fx.model
        # a generation just now: trusted for READY_GENERATION_FRESH_S (30 s), no new probe
        assert post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]}).status_code == 200
        fx.mode, calls = "hang", fx.calls
        assert httpx.get(f"{api.url}/readyz/pipeline", timeout=10).status_code == 200 and fx.calls == calls
    with (
        FaultyExecutor("hang", hang_s=30) as fx,
        # a probe timeout a loaded 2-core machine answers within (at 1 s the "ok" probe itself timed out under CI's
        # parallel lanes); the hang (30 s) still outlasts it
        service(fx.url, REWARD_API_READY_TIMEOUT_S="5", REWARD_API_READY_GENERATION_FRESH_S="0") as api,
    ):
        fx.mode = "ok"
        assert httpx.get(f"{api.url}/readyz/pipeline", timeout=10).status_code == 200
        fx.mode = "hang"  # window 0: every readiness check asks again
        assert httpx.get(f"{api.url}/readyz/pipeline", timeout=10).status_code == 503


def test_pipeline_requests_never_take_the_local_slots(golden_sample: list[GoldenExample]) -> None:
    """A slow executor holds every pipeline slot; schema/table requests (B1/B2) still get theirs."""
    ex = golden_sample[7]
    env = {"REWARD_API_MAX_CONCURRENT_REQUESTS": "1", "REWARD_API_QUEUE_TIMEOUT_S": "0.5"}
    with (
        FaultyExecutor("ok", content="{}", delay_s=3.0) as fx,
        service(fx.url, **env) as api,
        ThreadPoolExecutor(2) as pool,
    ):
        slow = pool.submit(post, api.url, "/reward/pipeline", {"items": [_pipe_item(ex)]})
        fx.wait_in_flight(1)  # the slow request holds the one pipeline slot before the next one queues
        queued = post(api.url, "/reward/pipeline", {"items": [_pipe_item(ex, "q", text="other")]})
        schema = {"items": [{"id": "s", "prediction": "[]", "gold_schema": ex.schema_dict()}]}
        local = post(api.url, "/reward/schema", schema)
        assert slow.result().status_code == 200
    assert queued.status_code == 429 and queued.json()["error"] == "too_many_requests"
    assert queued.headers["retry-after"] == "1"
    assert local.status_code == 200

"""The executor client's transport (aiohttp) in process: its errors map to the failure causes of
``failures``, and concurrent calls share one session. The HTTP server is the fault injector (real uvicorn)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from services.env_proxy import env_proxy
from services.reward_api.executor_client import ExecutorClient
from services.reward_api.failures import ExecutorFailure, classify_transport_error
from services.reward_api.settings import Settings
from tests.helpers.faulty_executor import FaultyExecutor


def test_transport_errors_map_to_causes() -> None:
    # A connect timeout is a connection error (retried, ejects); a read timeout is a timeout (not retried).
    assert classify_transport_error(aiohttp.ConnectionTimeoutError()) == "connect"
    assert classify_transport_error(aiohttp.SocketTimeoutError()) == "timeout"
    assert classify_transport_error(TimeoutError()) == "timeout"
    assert classify_transport_error(aiohttp.ServerDisconnectedError()) == "connect"
    assert classify_transport_error(aiohttp.ClientPayloadError("cut")) == "connect"
    assert classify_transport_error(aiohttp.ClientOSError()) == "connect"


def _settings(url: str, **kw: object) -> Settings:
    fields: dict[str, object] = {"executor_urls": [url], "cache_size": 0, "retries": 0, "log_level": "WARNING", **kw}
    return Settings(**fields)  # type: ignore[arg-type]


def test_concurrent_calls_through_one_session() -> None:
    """More calls than MAX_IN_FLIGHT, all concurrent: each answered once, by its own call (the caller's key)."""
    with FaultyExecutor("ok", content='{"a": "1"}', delay_s=0.05) as fx:

        async def go() -> list[str]:
            client = ExecutorClient(_settings(fx.url, max_in_flight=4))
            try:
                msgs = [[{"role": "user", "content": f"doc {i}"}] for i in range(24)]
                outs = await asyncio.gather(*(client.complete(m, client.key(m)) for m in msgs))
                assert all(o.source == "call" for o in outs)
                return [o.text for o in outs]
            finally:
                await client.aclose()

        texts = asyncio.run(go())
        seen = sorted(r["messages"][0]["content"] for r in fx.requests)
    assert texts == ['{"a": "1"}'] * 24
    assert seen == sorted(f"doc {i}" for i in range(24))


@pytest.mark.parametrize(
    ("mode", "cause"), [("http_500", "http_5xx"), ("http_400", "http_4xx"), ("not_json", "garbage")]
)
def test_bad_answers_become_failures(mode: str, cause: str) -> None:
    with FaultyExecutor(mode) as fx:  # type: ignore[arg-type]
        failure = _failure_of(fx.url)
    assert failure.cause == cause


def test_connection_refused_is_connect() -> None:
    from tests.helpers.faulty_executor import closed_port

    with closed_port() as port:
        assert _failure_of(f"http://127.0.0.1:{port}").cause == "connect"


def _failure_of(url: str) -> ExecutorFailure:
    """The ExecutorFailure one completion against ``url`` raises (the test fails if none is raised)."""

    async def go() -> ExecutorFailure:
        client = ExecutorClient(_settings(url))
        try:
            with pytest.raises(ExecutorFailure) as info:
                await client.complete([{"role": "user", "content": "x"}])
            return info.value
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_the_environment_proxy_is_found_once_per_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("http://exec:8000") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert env_proxy("http://exec:8000") == "http://proxy:3128"
    assert env_proxy("http://127.0.0.1:8000") is None
    client = ExecutorClient(_settings("http://exec:8000"))
    assert client.replicas[0].proxy == "http://proxy:3128"


def test_identical_concurrent_calls_join_the_one_in_flight() -> None:
    """Single-flight, deterministic: the executor answers after 0.5 s (injected latency), so the three
    later identical calls arrive while the first is in flight and join it: one request to the executor."""
    with FaultyExecutor("ok", content='{"a": "1"}', delay_s=0.5) as fx:

        async def go() -> list[str]:
            client = ExecutorClient(_settings(fx.url))
            try:
                msgs = [{"role": "user", "content": "same doc"}]
                first = asyncio.create_task(client.complete(msgs))
                await asyncio.sleep(0.1)
                outs = await asyncio.gather(first, *(client.complete(msgs) for _ in range(3)))
                return [o.source for o in outs]
            finally:
                await client.aclose()

        sources = asyncio.run(go())
        n_requests = len(fx.requests)
    assert sources == ["call", "inflight", "inflight", "inflight"]
    assert n_requests == 1


# ---- one /v1/models read in flight; calls budgeted per executor replica ----------------------


@pytest.mark.parametrize("model_check_s", [5.0, 0.0])
def test_model_read_is_single_flight(model_check_s: float) -> None:
    """20 concurrent readers of the model card (a request's start, each prompt's length check) while
    /v1/models takes 0.5 s: one read, the others await it, even when the one that started it leaves
    (its request was cancelled). Before: a lock, so with MODEL_CHECK_S=0 each reader read again after the
    one before it (20 reads), and a cancelled first reader aborted the read (a second one)."""
    with FaultyExecutor("ok", models_delay_s=0.5, root="/models/a") as fx:

        async def go() -> None:
            client = ExecutorClient(_settings(fx.url, model_check_s=model_check_s))
            try:
                first = asyncio.create_task(client.refresh_model())
                await asyncio.sleep(0.1)
                others = [asyncio.create_task(client.refresh_model()) for _ in range(19)]
                await asyncio.sleep(0.1)
                first.cancel()
                await asyncio.gather(*others)
                assert client._identity == "/models/a"
            finally:
                await client.aclose()

        asyncio.run(go())
        assert fx.models_calls == 1


def test_in_flight_calls_are_capped_per_replica() -> None:
    """MAX_IN_FLIGHT_PER_EXECUTOR bounds the calls each replica has outstanding, apart from the process's
    MAX_IN_FLIGHT: two slow replicas, 16 slots in the process, 2 per replica: each sees 2 at most (and
    gets them), 4 in all. Before: only the process-wide 16, split 8 and 8 by least-in-flight routing."""
    with FaultyExecutor("ok", content="{}", delay_s=0.3) as a, FaultyExecutor("ok", content="{}", delay_s=0.3) as b:

        async def go() -> None:
            urls = {"executor_urls": [a.url, b.url]}
            client = ExecutorClient(_settings(a.url, max_in_flight=16, max_in_flight_per_executor=2, **urls))
            try:
                msgs = [[{"role": "user", "content": f"doc {i}"}] for i in range(12)]
                outs = await asyncio.gather(*(client.complete(m) for m in msgs))
                assert [o.source for o in outs] == ["call"] * 12
            finally:
                await client.aclose()

        asyncio.run(go())
        assert (a.max_in_flight, b.max_in_flight) == (2, 2)
        assert a.calls + b.calls == 12


def test_a_call_queued_at_an_ejected_replica_goes_elsewhere() -> None:
    """One slot per replica; 4 calls: two queue behind the first of each replica. Replica a answers 500
    and is ejected; the call queued there takes a's freed slot, finds a ejected and goes to b instead of
    sending a second call to a replica known to be failing."""
    with FaultyExecutor("http_500", delay_s=0.5) as a, FaultyExecutor("ok", content="{}", delay_s=0.5) as b:

        async def go() -> list[str]:
            urls = {"executor_urls": [a.url, b.url]}
            client = ExecutorClient(_settings(a.url, max_in_flight=4, max_in_flight_per_executor=1, **urls))
            try:
                msgs = [[{"role": "user", "content": f"doc {i}"}] for i in range(4)]
                outs = await asyncio.gather(*(client.complete(m) for m in msgs), return_exceptions=True)
                return [type(o).__name__ for o in outs]
            finally:
                await client.aclose()

        kinds = asyncio.run(go())
        assert (a.calls, b.calls) == (1, 3)
    assert sorted(kinds) == ["Completion", "Completion", "Completion", "ExecutorFailure"]

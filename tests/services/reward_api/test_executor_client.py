"""The executor client's transport (aiohttp) in process: its errors map to the failure causes of
``failures``, and concurrent calls share one session. The HTTP server is the fault injector (real uvicorn)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from services.reward_api.executor_client import ExecutorClient, env_proxy
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
    return Settings(executor_urls=[url], cache_size=0, retries=0, log_level="WARNING", **kw)  # type: ignore[arg-type]


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
    from services.executor_vllm.cpu_launcher import free_port

    assert _failure_of(f"http://127.0.0.1:{free_port()}").cause == "connect"


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

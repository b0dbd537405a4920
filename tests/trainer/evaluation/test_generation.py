"""The batch client of eval, inference and the preflight: how many calls it really holds in flight, and
which failures it retries. ``FaultyExecutor`` slows or fails answers on purpose (a real HTTP server)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.helpers.faulty_executor import FaultyExecutor
from trainer.evaluation.generation import ExecutorHTTPError, GenerationClient, GenerationConfig, GenerationFailed

PROMPT = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("concurrency", [7, 150])
def test_the_client_holds_its_concurrency_in_flight_also_above_httpx_default_pool(concurrency: int) -> None:
    """httpx's default pool had 100 connections: ``concurrency=150`` used to reach only 100 in flight."""
    with FaultyExecutor("ok", content="x", delay_s=1.0) as ex:
        gen = GenerationConfig(concurrency=concurrency, timeout_s=30.0, max_attempts=1)
        out = asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT] * (2 * concurrency)))
        assert out == ["x"] * (2 * concurrency)
        assert ex.max_in_flight == concurrency


def test_samples_run_at_the_client_concurrency() -> None:
    with FaultyExecutor("ok", content="s", delay_s=1.0) as ex:
        gen = GenerationConfig(concurrency=120, timeout_s=30.0, max_attempts=1)
        out = asyncio.run(GenerationClient(ex.url, ex.model, gen).sample([PROMPT] * 240, 1))
        assert out == [["s"]] * 240
        assert ex.max_in_flight == 120
        assert all(r["seed"] == i for i, r in enumerate(sorted(ex.requests, key=lambda r: r["seed"])))


@pytest.mark.parametrize("mode", ["http_500", "http_429"])
def test_5xx_and_429_are_retried(mode: str) -> None:
    with FaultyExecutor(mode, content="late", fail_first=2) as ex:
        gen = GenerationConfig(concurrency=1, max_attempts=3)
        assert asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT])) == ["late"]
        assert ex.calls == 3


def test_a_400_is_not_retried_and_raises() -> None:
    with FaultyExecutor("http_400") as ex:
        gen = GenerationConfig(concurrency=1, max_attempts=3)
        with pytest.raises(GenerationFailed, match=r"prompt 0: ExecutorHTTPError: .*HTTP 400: .*injected 400") as err:
            asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT]))
        assert isinstance(err.value.__cause__, ExecutorHTTPError) and err.value.index == 0
        assert ex.calls == 1


def test_a_redirect_is_not_followed_and_raises() -> None:
    with FaultyExecutor("redirect", redirect_to="http://127.0.0.1:9/elsewhere") as ex:
        gen = GenerationConfig(concurrency=1, max_attempts=3)
        with pytest.raises(GenerationFailed, match="HTTP 307"):
            asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT]))
        assert ex.calls == 1


def test_a_refused_connection_is_retried_then_raises() -> None:
    from tests.helpers.faulty_executor import closed_port

    gen = GenerationConfig(concurrency=1, max_attempts=2, timeout_s=5.0)
    with closed_port() as port, pytest.raises(GenerationFailed) as err:
        asyncio.run(GenerationClient(f"http://127.0.0.1:{port}", "m", gen).generate([PROMPT]))
    assert isinstance(err.value.__cause__, aiohttp.ClientConnectionError)


def test_a_hung_executor_costs_one_timeout_not_one_per_attempt() -> None:
    """The call's timeout is one deadline, its retries included: a hung executor is not asked 3 times."""
    with FaultyExecutor("hang", hang_s=30.0) as ex:
        gen = GenerationConfig(concurrency=1, max_attempts=3, timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(GenerationFailed, match=r"prompt 0: no answer within 1.0 s \(the call's deadline") as err:
            asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT]))
        took = time.monotonic() - start
        assert isinstance(err.value.__cause__, TimeoutError)
        assert 1.0 <= took < 2.0 and ex.calls == 1, (took, ex.calls)


def test_retries_of_a_failing_executor_stop_at_the_deadline() -> None:
    """5xx answers are retried while the deadline lasts, and the last one is what the error says."""
    with FaultyExecutor("http_500") as ex:
        gen = GenerationConfig(concurrency=1, max_attempts=100, timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(GenerationFailed, match=r"HTTP 500"):
            asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT]))
        assert time.monotonic() - start < 2.0 and 2 <= ex.calls < 100


def test_a_refused_prompt_is_its_own_answer_and_the_others_arrive_as_they_come() -> None:
    """``keep_refused``: the executor's 400 for one prompt is that prompt's empty answer saying why; every answer,
    that one included, is handed over as it arrives."""
    from trainer.evaluation.generation import refusal

    long = [{"role": "user", "content": "x" * 500}]
    with FaultyExecutor("ok", content="fine", too_long_chars=100) as ex:
        seen: dict[int, str] = {}
        client = GenerationClient(ex.url, ex.model, GenerationConfig(concurrency=2), keep_refused=True,
                                  on_answer=seen.__setitem__)  # fmt: skip
        out = asyncio.run(client.generate([PROMPT, long, PROMPT]))
        assert out == ["fine", "", "fine"] and seen == dict(enumerate(out)) and ex.calls == 3
        assert refusal(out[0]) is None and "HTTP 400" in str(refusal(out[1]))
        assert "maximum context length" in str(refusal(out[1]))


def test_the_environment_proxy_is_read_once_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert GenerationClient("http://exec:8000/v1", "m").proxy == "http://proxy:3128"
    assert GenerationClient("http://127.0.0.1:8000", "m").proxy is None

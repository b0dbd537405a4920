"""The batch client of eval, inference and the preflight: how many calls it really holds in flight, and
which failures it retries. ``FaultyExecutor`` slows or fails answers on purpose (a real HTTP server)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.helpers.faulty_executor import FaultyExecutor
from trainer.evaluation.generation import GenerationClient, GenerationConfig

PROMPT = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("concurrency", [7, 150])
def test_the_client_holds_its_concurrency_in_flight_also_above_httpx_default_pool(concurrency: int) -> None:
    """httpx's default pool has 100 connections: ``concurrency=150`` used to reach only 100 in flight."""
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
        with pytest.raises(httpx.HTTPStatusError, match="400"):
            asyncio.run(GenerationClient(ex.url, ex.model, gen).generate([PROMPT]))
        assert ex.calls == 1

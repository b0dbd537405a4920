"""The local-rewards bench: warm-up requests stay off the clock, answers are checked, ratios pair rounds.

The server is the real reward_api app (uvicorn in a thread); ``FirstRequestDelayInjector`` is a fault
injector in front of it that holds back the first reward request, so a warm-up that leaked into the
timed interval would show as a whole delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.common import Timing, load_examples
from bench.local_rewards import (
    Mismatch,
    _batches,
    _median_round,
    build_items,
    in_process_rewards,
    paired_ratios,
    render_md,
    time_http,
)
from services.reward_api.app import create_app
from services.reward_api.settings import Settings
from tests.helpers.servers import ThreadServer

DELAY_S = 1.5


class FirstRequestDelayInjector:
    """Fault injector: the first ``/reward/*`` request waits ``delay_s`` before the real app sees it."""

    def __init__(self, app: ASGIApp, delay_s: float) -> None:
        self.app = app
        self.delay_s = delay_s
        self.delayed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/reward/") and self.delayed == 0:
            self.delayed += 1
            await asyncio.sleep(self.delay_s)
        await self.app(scope, receive, send)


@pytest.fixture()
def delayed_server() -> Iterator[tuple[ThreadServer, FirstRequestDelayInjector]]:
    injector = FirstRequestDelayInjector(create_app(Settings(log_level="WARNING")), DELAY_S)
    with ThreadServer(injector) as server:
        yield server, injector


@pytest.fixture(scope="module")
def schema_batches(golden_dir: Path) -> tuple[list[list[dict[str, Any]]], list[list[float]]]:
    items = build_items(load_examples(golden_dir, 48), "schema")
    batches = _batches(items, 16, 3)
    return batches, [in_process_rewards("schema", b) for b in batches]


@pytest.mark.parametrize("clients", [1, 2])
def test_warm_up_is_not_timed(
    delayed_server: tuple[ThreadServer, FirstRequestDelayInjector],
    schema_batches: tuple[list[list[dict[str, Any]]], list[list[float]]],
    clients: int,
) -> None:
    server, injector = delayed_server
    batches, expected = schema_batches
    timing = time_http(server.url, "schema", batches, expected, concurrency=clients)
    assert injector.delayed == 1  # a warm-up request did wait
    assert timing.items == 48
    assert len(timing.latencies_s) == 3  # the timed requests: one per batch, warm-ups not among them
    # Three batches of 16 take milliseconds; the held-back warm-up (1.5 s) must not be in the elapsed time.
    assert timing.seconds < DELAY_S - 0.5
    assert max(timing.latencies_s) < DELAY_S - 0.5


@pytest.mark.parametrize("clients", [1, 2])
def test_a_wrong_warm_up_answer_raises_instead_of_hanging(
    delayed_server: tuple[ThreadServer, FirstRequestDelayInjector],
    schema_batches: tuple[list[list[dict[str, Any]]], list[list[float]]],
    clients: int,
) -> None:
    server, _ = delayed_server
    batches, expected = schema_batches
    wrong = [[r + 0.5 for r in expected[0]], *expected[1:]]
    with pytest.raises(Mismatch, match="rewards differ"):
        time_http(server.url, "schema", batches, wrong, concurrency=clients)


def test_a_wrong_timed_answer_raises(
    delayed_server: tuple[ThreadServer, FirstRequestDelayInjector],
    schema_batches: tuple[list[list[dict[str, Any]]], list[list[float]]],
) -> None:
    server, _ = delayed_server
    batches, expected = schema_batches
    wrong = [expected[0], expected[1], [-r for r in expected[2]]]
    assert any(r != 0 for r in expected[2])  # negating changes at least one value
    with pytest.raises(Mismatch, match="rewards differ"):
        time_http(server.url, "schema", batches, wrong, concurrency=1)


def test_rounds_keep_their_order_and_ratios_pair_them() -> None:
    in_process = _median_round([Timing(100, 1.0, [0.5]), Timing(100, 4.0, [2.0]), Timing(100, 2.0, [1.0])])
    http = _median_round([Timing(100, 2.0, [1.0]), Timing(100, 5.0, [2.5]), Timing(100, 2.5, [1.2])])
    assert in_process["round_items_per_s"] == [100.0, 25.0, 50.0]
    assert in_process["items_per_s"] == 50.0  # the median round
    assert paired_ratios(http, in_process) == [0.5, 0.8, 0.8]
    goal = {"goal": "g", "value": 0.8, "target": 0.7, "met": True, "binding": True, "per_round": [0.5, 0.8, 0.8]}
    run = {"quick": False, "noisy": False, "timestamp": "t", "command": "c", "loadavg_1m_at_start": 0.1}
    versions = {"python": "3.11", "vllm": "v", "fastapi": "f", "uvicorn": "u", "project_commit": "c"}
    run |= {"machine": {"cpu": "x", "cores": 2, "ram_gib": 1.0}, "versions": versions}
    md = render_md({"run": run, "repeats": 3, "goals": [goal], "rows": [], "plot": None})
    assert "| g | 0.8 | 0.7 | yes | met | 0.5 / 0.8 / 0.8 |" in md

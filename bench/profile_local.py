"""Where a local-reward request spends its time: cProfile over the reward_api's ASGI app at batch 1024.

The requests go through the real app (middleware, routes, validation, scoring, encoding) in this
process via ``httpx.ASGITransport``, so one profiler sees them; uvicorn's HTTP parsing is not included.
The app's lifespan runs as under uvicorn (its start-up freezes the heap out of the cyclic GC). cProfile
sees one thread, so for the profile the scoring runs on the event loop's thread instead of ``anyio``'s
worker thread (the same code, without the thread hop). The request bodies are encoded before profiling
starts: the table shows the server's share only. The time spent in the cyclic GC (which cProfile charges
to whatever allocated when a collection started) is reported beside the tables.

Each kind is profiled twice in one run: as served, and with the start-up heap unfrozen again (the service
before ``app.freeze_startup_heap``), so the two can be compared on the same machine state.

``python -m bench profile-local [--kind schema|table] [--requests N]`` writes
``bench/results/local_rewards_profile.{json,md}`` with the top 20 functions by own time and by cumulative time.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import json
import pstats
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from bench.common import golden_dir, header_md, load_examples, md_table, run_record, write_result
from bench.local_rewards import build_items

T = TypeVar("T")
TOP = 20


async def _inline(fn: Callable[[], T]) -> T:
    return fn()


def _rows(stats: pstats.Stats, key: str) -> list[dict[str, Any]]:
    stats.sort_stats(key)
    out = []
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for func in stats.fcn_list[:TOP]:  # type: ignore[attr-defined]
        _cc, nc, tt, ct, _ = entries[func]
        filename, line, name = func
        out.append(
            {
                "function": f"{name} ({filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{line})",
                "calls": nc,
                "own_s": round(tt, 4),
                "cumulative_s": round(ct, 4),
            }
        )
    return out


class GcTimer:
    """Collections per generation and the seconds spent in them while installed in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def profile(kind: str, n_requests: int, batch: int, golden: str | None = None, frozen: bool = True) -> dict[str, Any]:
    import services.reward_api.routes as routes
    from services.reward_api.app import create_app
    from services.reward_api.settings import Settings

    examples = load_examples(golden_dir(golden), batch, seed=0)
    items = build_items(examples, kind, seed=0)
    random.Random(0).shuffle(items)
    body = json.dumps({"items": items[:batch]}).encode()
    app = create_app(Settings(log_level="WARNING"))
    routes.off_loop = _inline  # type: ignore[attr-defined]

    prof = cProfile.Profile()
    gc_timer = GcTimer()

    async def drive(client: httpx.AsyncClient, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            r = await client.post(f"/reward/{kind}", content=body, headers={"content-type": "application/json"})
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        return time.perf_counter() - t0

    async def serve() -> float:
        async with app.router.lifespan_context(app):
            if not frozen:
                gc.unfreeze()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                await drive(client, 1)  # warm-up
                with gc_timer:
                    prof.enable()
                    seconds = await drive(client, n_requests)
                    prof.disable()
        return seconds

    seconds = asyncio.run(serve())
    stats = pstats.Stats(prof, stream=io.StringIO())
    return {
        "kind": kind,
        "batch": batch,
        "requests": n_requests,
        "startup_heap_frozen": frozen,
        "seconds_under_profiler": round(seconds, 3),
        "total_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
        "gc_s": round(gc_timer.seconds, 4),
        "gc_collections": gc_timer.collections,
        "by_own_time": _rows(stats, "tottime"),
        "by_cumulative": _rows(stats, "cumulative"),
    }


def run(kinds: tuple[str, ...] = ("schema", "table"), n_requests: int = 10, batch: int = 1024) -> dict[str, Any]:
    record = run_record(quick=False)
    payload = {
        "benchmark": "local_rewards_profile",
        "run": record,
        "profiles": [profile(k, n_requests, batch, frozen=f) for k in kinds for f in (False, True)],
    }
    write_result("local_rewards_profile", payload, render_md(payload), quick=False)
    return payload


def render_md(p: dict[str, Any]) -> str:
    md = header_md("Local rewards: where a request's time goes (cProfile)", p["run"])
    md += (
        "cProfile over the reward_api ASGI app in one process (`httpx.ASGITransport`, no uvicorn), request "
        "bodies encoded before profiling; the app's lifespan runs as under uvicorn; scoring runs inline instead "
        "of in a worker thread so that the profiler sees it. Each kind twice: as served (start-up heap frozen "
        "out of the cyclic GC) and with it unfrozen (the service before that change). GC time is what "
        "`gc.callbacks` measured; cProfile charges it to the function that was allocating.\n\n"
    )
    for prof in p["profiles"]:
        heap = "start-up heap frozen (as served)" if prof["startup_heap_frozen"] else "start-up heap NOT frozen"
        g0, g1, g2 = prof["gc_collections"]
        gc_line = f"Cyclic GC: {prof['gc_s']} s in {g0} / {g1} / {g2} collections of generation 0 / 1 / 2.\n\n"
        md += (
            f"## {prof['kind']}, {heap}: {prof['requests']} requests × batch {prof['batch']} "
            f"({prof['total_s']} s profiled)\n\n{gc_line}### Top {TOP} by own time\n\n"
        )
        md += md_table(
            ["function", "calls", "own s", "cumulative s"],
            [[r["function"], r["calls"], r["own_s"], r["cumulative_s"]] for r in prof["by_own_time"]],
        )
        md += f"\n### Top {TOP} by cumulative time\n\n"
        md += md_table(
            ["function", "calls", "own s", "cumulative s"],
            [[r["function"], r["calls"], r["own_s"], r["cumulative_s"]] for r in prof["by_cumulative"]],
        )
        md += "\n"
    return md

"""Load: many concurrent clients sending batched requests to a real reward_api (2 workers).

Every answer is checked item by item: no error, no lost result, no misordered result, and every
reward equal to the in-process ``shared`` value for that exact item (so a mixed-up batch cannot pass).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from bench.common import perturb_schema, perturb_table
from shared import GoldenExample, compute_schema_reward_single, compute_table_reward_single
from tests.helpers.servers import RewardApiServer
from tests.reliability.conftest import Scale

pytestmark = [pytest.mark.service, pytest.mark.slow]


def _pool(examples: list[GoldenExample], kind: str, n: int, seed: int) -> list[tuple[dict[str, Any], float]]:
    """Items with their in-process reward, from perturbed golden predictions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ex = examples[i % len(examples)]
        if kind == "schema":
            pred = perturb_schema(ex, rng)
            item = {"prediction": pred, "gold_schema": ex.schema_dict()}
            reward = compute_schema_reward_single(pred, ex.schema_dict()).reward
        else:
            pred = perturb_table(ex, rng)
            item = {"prediction": pred, "gold_table": ex.table_dict()}
            reward = compute_table_reward_single(pred, ex.table_dict()).reward
        out.append((item, reward))
    return out


async def _client(
    cid: int, url: str, scale: Scale, pools: dict[str, list[tuple[dict[str, Any], float]]], tally: Counter[str]
) -> None:
    rng = random.Random(cid)
    async with httpx.AsyncClient(timeout=120.0) as client:
        for req in range(scale.load_requests):
            kind = "schema" if (cid + req) % 2 == 0 else "table"
            picks = [rng.choice(pools[kind]) for _ in range(scale.load_batch)]
            items = [{"id": f"c{cid}-r{req}-i{i}", **it} for i, (it, _) in enumerate(picks)]
            tally["requests"] += 1
            tally["items_sent"] += len(items)
            try:
                r = await client.post(f"{url}/reward/{kind}", json={"items": items})
            except httpx.HTTPError as exc:
                tally[f"transport_error:{type(exc).__name__}"] += 1
                continue
            if r.status_code != 200:
                tally[f"http_{r.status_code}"] += 1
                continue
            results = r.json()["results"]
            got_ids = [x["id"] for x in results]
            want_ids = [it["id"] for it in items]
            tally["items_returned"] += len(results)
            if set(got_ids) != set(want_ids) or len(got_ids) != len(want_ids):
                tally["lost_or_extra"] += 1
            elif got_ids != want_ids:
                tally["misordered"] += 1
            for x, (_, want) in zip(results, picks, strict=False):
                if abs(x["reward"] - want) > 1e-9:
                    tally["wrong_reward"] += 1


def test_concurrent_batched_load(
    local_api: RewardApiServer, examples: list[GoldenExample], scale: Scale, record_property: Any
) -> None:
    """Concurrent clients × batched requests on /reward/schema and /reward/table."""
    pools = {"schema": _pool(examples, "schema", 400, 1), "table": _pool(examples, "table", 400, 2)}
    tally: Counter[str] = Counter()

    async def main() -> None:
        await asyncio.gather(*(_client(c, local_api.url, scale, pools, tally) for c in range(scale.load_clients)))

    t0 = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - t0
    bad = {k: v for k, v in tally.items() if k not in ("requests", "items_sent", "items_returned")}
    record_property(
        "tried",
        f"{scale.load_clients} clients × {scale.load_requests} requests × {scale.load_batch} items"
        + ("" if scale.full else " (CI scale; full run: 32 × 200)"),
    )
    record_property("expected", "0 errors, 0 lost, 0 misordered, 0 wrong rewards")
    record_property(
        "observed",
        f"{tally['requests']} requests, {tally['items_returned']}/{tally['items_sent']} items back in "
        f"{elapsed:.0f} s; problems: {bad or 'none'}",
    )
    assert tally["requests"] == scale.load_clients * scale.load_requests
    assert bad == {}
    assert tally["items_returned"] == tally["items_sent"]

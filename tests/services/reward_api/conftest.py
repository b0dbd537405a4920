"""Fixtures of the reward_api tests: real golden examples, predictions of mixed quality, a metrics reader."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared import GoldenExample, canonical_schema_json, gold_ndjson, read_split
from tests.helpers.servers import RewardApiServer


@pytest.fixture(scope="session")
def golden_sample(golden_dir: Path) -> list[GoldenExample]:
    """40 real test-split examples spread over the whole file (all its sources), with at least one row."""
    examples = [ex for ex in read_split(golden_dir, "test") if ex.table.data]
    step = max(1, len(examples) // 40)
    return examples[::step][:40]


def schema_predictions(ex: GoldenExample, rng: random.Random) -> list[str]:
    """Predicted schemas of every kind: exact, fenced, partial, with an extra name, camelCase, a list, invalid."""
    names = ex.schema_.names()
    camel = ["".join(w.capitalize() if i else w for i, w in enumerate(n.split("_"))) for n in names]
    half = names[: max(1, len(names) // 2)]
    return [
        canonical_schema_json(ex.schema_dict()),
        "```json\n" + json.dumps({"fields": [{"name": n} for n in names]}) + "\n```",
        json.dumps({"columns": [{"name": n} for n in half]}),
        json.dumps({"columns": [*names, "invented_column"]}),
        json.dumps(camel),
        json.dumps(rng.sample(names, len(names))),
        "not a schema {",
    ]


def _as_lines(rows: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(r) for r in rows)


def table_predictions(ex: GoldenExample, rng: random.Random) -> list[str]:
    """Predicted tables: exact, rows shuffled, a cell changed, a row missing, padded, invalid NDJSON, empty."""
    rows = [json.loads(line) for line in gold_ndjson(ex.table_dict()).splitlines()]
    shuffled = rows[:]
    rng.shuffle(shuffled)
    changed = [dict(r) for r in rows]
    first_key = next(iter(changed[0]))
    changed[0][first_key] = "WRONG VALUE"
    return [
        gold_ndjson(ex.table_dict()),
        _as_lines(shuffled),
        _as_lines(changed),
        _as_lines(rows[:-1]),
        "  \n" + _as_lines(rows) + "\n\n",
        _as_lines(rows) + "\nthis is not json",
        "",
    ]


@pytest.fixture(scope="module")
def local_server() -> Iterator[RewardApiServer]:
    """A real reward_api process without an executor (schema/table rewards)."""
    with RewardApiServer(env={"REWARD_API_EXECUTOR_URLS": "", "REWARD_API_TOKEN": ""}) as server:
        yield server


def metric(base_url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample's value from ``/metrics`` (0.0 if the series does not exist yet)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    want = labels or {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                total += sample.value
    return total


def post(base_url: str, path: str, body: Any, timeout: float = 120.0, **kw: Any) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=timeout, **kw)

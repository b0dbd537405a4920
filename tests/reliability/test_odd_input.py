"""Bad input: lone surrogates, non-finite numbers, config bounds, broken bodies.

Policy under test (docs/reward_api.md, "Bad input"): a string that is not valid Unicode (a lone UTF-16
surrogate) is a 422 naming its field, never a 500; a valid string, whatever its characters, is accepted
and echoed back unchanged. ``NaN``/``Infinity`` anywhere is a 422 naming the field. One config validator
serves schema, table and pipeline. Every reward of every 200 is finite and within its config's bounds.
A body that is not UTF-8 or nests too deep is a 400 that says where (byte, line, column) and why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import (
    GoldenExample,
    PipelineSchemaRewardConfig,
    SchemaRewardConfig,
    TableRewardConfig,
    canonical_schema_json,
    gold_ndjson,
)
from tests.helpers.faulty_executor import FaultyExecutor
from tests.helpers.servers import RewardApiServer
from tests.reliability.conftest import Scale, full_text, reward_problems

pytestmark = [pytest.mark.service, pytest.mark.slow]

ENDPOINTS = ("schema", "table", "pipeline")
JSON = {"content-type": "application/json"}
CONFIGS: dict[str, type[Any]] = {
    "schema": SchemaRewardConfig,
    "table": TableRewardConfig,
    "pipeline": PipelineSchemaRewardConfig,
}


@pytest.fixture(scope="module")
def odd_api() -> Iterator[RewardApiServer]:
    env = {"REWARD_API_EXECUTOR_TIMEOUT_S": "5", "REWARD_API_LOG_LEVEL": "WARNING", "REWARD_API_CACHE_SIZE": "0"}
    with (
        FaultyExecutor(mode="ok", content='{"name": "x"}') as ex,
        RewardApiServer({**env, "REWARD_API_EXECUTOR_URLS": ex.url}) as api,
    ):
        yield api


def _items(endpoint: str, examples: list[GoldenExample], n: int = 3) -> list[dict[str, Any]]:
    """Valid items of mixed quality (gold, partial and unparseable predictions)."""
    out = []
    for i, ex in enumerate(examples[:n]):
        schema_pred = [canonical_schema_json(ex.schema_dict()), json.dumps(ex.schema_.names()[:1]), "not json {"][i % 3]
        if endpoint == "table":
            pred = [gold_ndjson(ex.table_dict()), '{"x": "1"}', "not ndjson"][i % 3]
            out.append({"id": f"t{i}", "prediction": pred, "gold_table": ex.table_dict()})
        elif endpoint == "schema":
            out.append({"id": f"s{i}", "prediction": schema_pred, "gold_schema": ex.schema_dict()})
        else:
            out.append(
                {
                    "id": f"p{i}",
                    "prediction": schema_pred,
                    "text": ex.text[:2000],
                    "gold_schema": ex.schema_dict(),
                    "gold_table": ex.table_dict(),
                }
            )
    return out


def string_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every string inside a JSON value, as a path of keys and indexes."""
    if isinstance(value, str):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in string_paths(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in string_paths(v, (*path, i))]
    return []


def field_name(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def _lone_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def test_any_string_in_any_field(
    odd_api: RewardApiServer, examples: list[GoldenExample], scale: Scale, record_property: Any
) -> None:
    """Full Unicode (lone surrogates included) in every string field of every endpoint."""
    failures: list[str] = []
    seen: dict[int, int] = {}
    with httpx.Client(timeout=30) as client:

        @settings(
            max_examples=scale.fuzz_examples * 4, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(endpoint=st.sampled_from(ENDPOINTS), text=full_text(12), data=st.data())
        def run(endpoint: str, text: str, data: st.DataObject) -> None:
            body = {"items": _items(endpoint, examples)}
            path = data.draw(st.sampled_from(sorted(string_paths(body), key=str)), label="path")
            _set(body, path, text)
            # What the server decodes: json joins a high + low surrogate pair into one valid character.
            sent = json.loads(json.dumps(text))
            r = client.post(f"{odd_api.url}/reward/{endpoint}", content=json.dumps(body).encode(), headers=JSON)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            where = f"/reward/{endpoint} {field_name(path)}={text!r}"
            if r.status_code >= 500:
                failures.append(f"{where}: {r.status_code} {r.text[:200]}")
            elif _lone_surrogate(sent):
                named = [d.get("field") for d in r.json().get("detail", [])] if r.status_code == 422 else []
                if field_name(path) not in named:
                    failures.append(f"{where}: want 422 naming {field_name(path)}, got {r.status_code} {named}")
            elif r.status_code == 200 and path[-1] == "id":
                k = path[1]
                if r.json()["results"][k]["id"] != sent:
                    failures.append(f"{where}: id echoed as {r.json()['results'][k]['id']!r}")
            elif r.status_code not in (200, 422):
                failures.append(f"{where}: {r.status_code}")

        run()
    record_property("expected", "lone surrogate: 422 naming the field; other text: accepted, id echoed unchanged")
    record_property("observed", f"status counts {dict(sorted(seen.items()))}; contract breaks: {len(failures)}")
    assert failures == [], failures[:10]


_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-3, 3),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0]),
)


def _config(endpoint: str, data: st.DataObject) -> dict[str, Any]:
    keys = {
        "schema": [
            "min_reward",
            "max_reward",
            "invalid_json_penalty",
            "f1_weight",
            "precision_weight",
            "recall_weight",
        ],
        "table": ["min_reward", "max_reward", "invalid_json_penalty"],
        "pipeline": ["min_reward", "max_reward", "schema_weight"],
    }[endpoint]
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=3), label="keys")
    cfg: dict[str, Any] = {k: data.draw(_NUMBER, label=k) for k in chosen}
    if endpoint == "pipeline":
        for part, sub in (("schema_reward", "schema"), ("table_reward", "table")):
            if data.draw(st.booleans(), label=part):
                cfg[part] = _config(sub, data)
    return cfg


def _non_finite(cfg: dict[str, Any], prefix: str = "config") -> list[str]:
    out = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            out += _non_finite(v, f"{prefix}.{k}")
        elif isinstance(v, float) and not math.isfinite(v):
            out.append(f"{prefix}.{k}")
    return out


def test_rewards_finite_and_within_bounds(
    odd_api: RewardApiServer, examples: list[GoldenExample], scale: Scale, record_property: Any
) -> None:
    """Config overrides with NaN, ±Infinity, huge and ordinary numbers on every endpoint."""
    failures: list[str] = []
    seen: dict[int, int] = {}
    with httpx.Client(timeout=30) as client:

        @settings(
            max_examples=scale.fuzz_examples * 4, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
        def run(endpoint: str, data: st.DataObject) -> None:
            cfg = _config(endpoint, data)
            items = _items(endpoint, examples)
            # json.dumps writes NaN / Infinity literals, as a careless client would.
            body = json.dumps({"items": items, "config": cfg})
            r = client.post(f"{odd_api.url}/reward/{endpoint}", content=body, headers=JSON)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            where = f"/reward/{endpoint} config={cfg}"
            bad = _non_finite(cfg)
            if bad:
                named = [d.get("field") for d in r.json().get("detail", [])] if r.status_code == 422 else []
                if r.status_code != 422 or not set(bad) & set(named):
                    failures.append(f"{where}: want 422 naming one of {bad}, got {r.status_code} {named}")
                return
            try:
                CONFIGS[endpoint].model_validate(cfg)
            except ValueError:
                if r.status_code != 422 or not all(d["field"].startswith("config") for d in r.json()["detail"]):
                    failures.append(f"{where}: invalid config, want 422 naming config, got {r.status_code}")
                return
            if r.status_code != 200:
                failures.append(f"{where}: {r.status_code} {r.text[:200]}")
                return
            failures.extend(f"{where}: {p}" for p in reward_problems(endpoint, cfg, r.json()))

        run()
    record_property("expected", "non-finite: 422 naming config.<field>; else every reward finite, in [min, max]")
    record_property("observed", f"status counts {dict(sorted(seen.items()))}; contract breaks: {len(failures)}")
    assert failures == [], failures[:10]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_one_config_validator(
    endpoint: str, odd_api: RewardApiServer, examples: list[GoldenExample], record_property: Any
) -> None:
    """min_reward > max_reward, and a span max − min that overflows, on every endpoint."""
    got = []
    for cfg in ({"min_reward": 1, "max_reward": 0}, {"min_reward": -1e308, "max_reward": 1e308}):
        r = httpx.post(f"{odd_api.url}/reward/{endpoint}", json={"items": _items(endpoint, examples), "config": cfg})
        got.append(
            (r.status_code, [d.get("field") for d in r.json().get("detail", [])] if r.status_code == 422 else [])
        )
    record_property("tried", f"/reward/{endpoint} with min_reward > max_reward, and with max − min = inf")
    record_property("expected", "422 naming config, as on every endpoint")
    record_property("observed", str(got))
    assert got == [(422, ["config"]), (422, ["config"])]


def test_unparseable_body_says_where(odd_api: RewardApiServer, record_property: Any) -> None:
    """Invalid UTF-8, nesting past the parser's limit and broken JSON: the answer says where and why."""
    url = f"{odd_api.url}/reward/schema"
    bad_utf8 = b'{"items": [\n  {"id": "a\xffb"}]}'
    r1 = httpx.post(url, content=bad_utf8, headers=JSON)
    d1 = r1.json()["detail"]
    deep = b'{"items": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    r2 = httpx.post(url, content=deep, headers=JSON)
    r3 = httpx.post(url, content=b'{"items": [}', headers=JSON)
    record_property("observed", f"{r1.status_code} {d1}; {r2.status_code} {r2.json()}; {r3.status_code} {r3.json()}")
    record_property(
        "expected", "400 with byte offset, line and column for bad UTF-8 and deep nesting; 422 json_invalid"
    )
    assert r1.status_code == 400 and r1.json()["error"] == "bad_request"
    assert (d1["byte_offset"], d1["line"], d1["column"]) == (bad_utf8.index(b"\xff"), 2, 12)
    assert "invalid start byte" in d1["message"]
    assert r2.status_code == 400 and "line 1 column" in r2.json()["detail"]["message"]
    assert "nested deeper" in r2.json()["detail"]["message"]
    assert r3.status_code == 422 and "line 1, column 12" in r3.json()["detail"][0]["message"]

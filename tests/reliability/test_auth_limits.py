"""Auth and limits: bearer token, body size, item count, on a real reward_api process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared import GoldenExample, canonical_schema_json
from tests.helpers.servers import RewardApiServer

pytestmark = [pytest.mark.service]

TOKEN = "reliability-secret-token"
MAX_ITEMS = 5
MAX_BODY = 20_000


@pytest.fixture(scope="module")
def guarded_api() -> Iterator[RewardApiServer]:
    env = {
        "REWARD_API_TOKEN": TOKEN,
        "REWARD_API_MAX_ITEMS": str(MAX_ITEMS),
        "REWARD_API_MAX_BODY_BYTES": str(MAX_BODY),
        "REWARD_API_LOG_LEVEL": "WARNING",
    }
    with RewardApiServer(env) as api:
        yield api


def _items(examples: list[GoldenExample], n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"i{i}", "prediction": canonical_schema_json(ex.schema_dict()), "gold_schema": ex.schema_dict()}
        for i, ex in enumerate(examples[:n])
    ]


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("headers", "label"),
    [({}, "no header"), ({"Authorization": "Bearer wrong"}, "wrong token"), ({"Authorization": TOKEN}, "no scheme")],
)
def test_token_required(
    guarded_api: RewardApiServer,
    examples: list[GoldenExample],
    headers: dict[str, str],
    label: str,
    record_property: Any,
) -> None:
    """/reward/schema with TOKEN set and a missing or wrong bearer token."""
    r = httpx.post(f"{guarded_api.url}/reward/schema", json={"items": _items(examples, 1)}, headers=headers)
    record_property("tried", f"/reward/schema with TOKEN set, {label}")
    record_property("expected", "401 unauthorized, WWW-Authenticate: Bearer")
    record_property("observed", f"{r.status_code} {r.json().get('error')}")
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    assert r.headers.get("www-authenticate", "").lower().startswith("bearer")


def test_token_accepted_and_health_open(
    guarded_api: RewardApiServer, examples: list[GoldenExample], record_property: Any
) -> None:
    """The right token scores; /healthz needs no token (probes carry none)."""
    r = httpx.post(f"{guarded_api.url}/reward/schema", json={"items": _items(examples, 2)}, headers=AUTH)
    h = httpx.get(f"{guarded_api.url}/healthz")
    record_property("expected", "200 with rewards 1.0 for gold predictions; /healthz 200")
    record_property(
        "observed", f"{r.status_code} rewards={[x['reward'] for x in r.json()['results']]}; healthz {h.status_code}"
    )
    assert r.status_code == 200
    assert [x["reward"] for x in r.json()["results"]] == [1.0, 1.0]
    assert h.status_code == 200


def test_body_over_limit(guarded_api: RewardApiServer, examples: list[GoldenExample], record_property: Any) -> None:
    """A body over MAX_BODY_BYTES, declared by Content-Length."""
    item = _items(examples, 1)[0] | {"prediction": "x" * (MAX_BODY + 1)}
    r = httpx.post(f"{guarded_api.url}/reward/schema", json={"items": [item]}, headers=AUTH)
    record_property("expected", "413 body_too_large")
    record_property("observed", f"{r.status_code} {r.json().get('error')}")
    assert r.status_code == 413
    assert r.json()["error"] == "body_too_large"


def test_body_over_limit_chunked(
    guarded_api: RewardApiServer, examples: list[GoldenExample], record_property: Any
) -> None:
    """A body over MAX_BODY_BYTES sent chunked (no Content-Length to check up front)."""
    import json

    payload = json.dumps({"items": [_items(examples, 1)[0] | {"prediction": "y" * (MAX_BODY * 2)}]}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 4096):
            yield payload[i : i + 4096]

    r = httpx.post(
        f"{guarded_api.url}/reward/schema", content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    record_property("expected", "413, body never fully read")
    record_property("observed", f"{r.status_code} {r.json().get('error')}")
    assert r.status_code == 413


def test_max_items(guarded_api: RewardApiServer, examples: list[GoldenExample], record_property: Any) -> None:
    """MAX_ITEMS + 1 items in one request, and exactly MAX_ITEMS."""
    over = httpx.post(f"{guarded_api.url}/reward/schema", json={"items": _items(examples, MAX_ITEMS + 1)}, headers=AUTH)
    at = httpx.post(f"{guarded_api.url}/reward/schema", json={"items": _items(examples, MAX_ITEMS)}, headers=AUTH)
    body = over.json()
    record_property("expected", f"{MAX_ITEMS + 1} items: 413 too_many_items naming 'items'; {MAX_ITEMS}: 200")
    record_property("observed", f"{over.status_code} {body.get('error')} {body.get('detail')}; {at.status_code}")
    assert over.status_code == 413
    assert body["error"] == "too_many_items"
    assert body["detail"]["field"] == "items"
    assert at.status_code == 200
    assert at.json()["count"] == MAX_ITEMS

"""Limits and auth over HTTP: 401 without the bearer token, 413 for too many items or a too-large
body (by Content-Length and while streaming), 422 naming the field for unknown keys or long texts."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from shared import GoldenExample, canonical_schema_json
from tests.helpers.servers import RewardApiServer
from tests.services.reward_api.conftest import metric, post

pytestmark = [pytest.mark.service]

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def limited_server() -> Iterator[RewardApiServer]:
    env = {
        "REWARD_API_TOKEN": TOKEN,
        "REWARD_API_MAX_ITEMS": "5",
        "REWARD_API_MAX_TEXT_CHARS": "300",
        "REWARD_API_MAX_BODY_BYTES": "20000",
        "REWARD_API_EXECUTOR_URLS": "",
    }
    with RewardApiServer(env=env) as server:
        yield server


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _item(ex: GoldenExample, prediction: str | None = None) -> dict[str, object]:
    return {
        "id": ex.id,
        "prediction": prediction or canonical_schema_json(ex.schema_dict()),
        "gold_schema": ex.schema_dict(),
    }


def test_token_required(limited_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    body = {"items": [_item(golden_sample[0])]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = post(limited_server.url, "/reward/schema", body, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in r.text
    assert httpx.get(f"{limited_server.url}/info").status_code == 401
    ok = post(limited_server.url, "/reward/schema", body, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["results"][0]["reward"] == 1.0
    info = httpx.get(f"{limited_server.url}/info", headers=AUTH)
    assert info.status_code == 200 and info.json()["auth"] is True and TOKEN not in info.text
    # Probes and scraping stay open.
    assert httpx.get(f"{limited_server.url}/healthz").status_code == 200
    assert httpx.get(f"{limited_server.url}/metrics").status_code == 200


def test_too_many_items_is_413(limited_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    body = {"items": [_item(ex) for ex in golden_sample[:6]]}
    r = post(limited_server.url, "/reward/schema", body, headers=AUTH)
    assert r.status_code == 413
    assert r.json() == {"error": "too_many_items", "detail": {"field": "items", "limit": 5, "got": 6}}
    assert post(limited_server.url, "/reward/schema", {"items": body["items"][:5]}, headers=AUTH).status_code == 200


def test_long_text_is_422_naming_the_field(limited_server: RewardApiServer, golden_sample: list[GoldenExample]) -> None:
    ex = golden_sample[0]
    items = [_item(ex), _item(ex, json.dumps(["x" * 400]))]
    r = post(limited_server.url, "/reward/schema", {"items": items}, headers=AUTH)
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_request"
    assert [d["field"] for d in r.json()["detail"]] == ["items[1].prediction"]
    pipe = {
        "items": [
            {
                "id": "p",
                "prediction": "[]",
                "text": "t" * 301,
                "gold_schema": ex.schema_dict(),
                "gold_table": ex.table_dict(),
            }
        ]
    }
    r = post(limited_server.url, "/reward/pipeline", pipe, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "items[0].text"


def test_unknown_keys_are_422_naming_the_field(
    limited_server: RewardApiServer, golden_sample: list[GoldenExample]
) -> None:
    ex = golden_sample[0]
    cases = {
        "items[0].gold": {"items": [{**_item(ex), "gold": 1}]},
        "config.f1_weigth": {"items": [_item(ex)], "config": {"f1_weigth": 2}},
        "items[0].gold_schema": {"items": [{"id": "a", "prediction": "[]"}]},  # missing
        "debug": {"items": [], "debug": "maybe"},
        "body": None,  # not JSON at all
    }
    for field, body in cases.items():
        if body is None:
            r = httpx.post(
                f"{limited_server.url}/reward/schema",
                content=b"{not json",
                headers={**AUTH, "content-type": "application/json"},
            )
        else:
            r = post(limited_server.url, "/reward/schema", body, headers=AUTH)
        assert r.status_code == 422, (field, r.text)
        assert r.json()["error"] == "invalid_request"
        assert field in [d["field"] for d in r.json()["detail"]], (field, r.json())
    bad_table = {"items": [{"id": "t", "prediction": "", "gold_table": {**ex.table_dict(), "extra_rows": []}}]}
    # Gold objects allow extra keys (golden files carry more than the reward needs); requests do not.
    assert post(limited_server.url, "/reward/table", bad_table, headers=AUTH).status_code == 200
    wrong_mode = {"items": [], "on_executor_error": "ignore"}
    r = post(limited_server.url, "/reward/pipeline", wrong_mode, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "on_executor_error"


def test_body_limit_by_length_and_while_streaming(limited_server: RewardApiServer) -> None:
    before = metric(limited_server.url, "reward_api_failures_total", {"cls": "body_too_large"})
    big = json.dumps({"items": [], "pad": "x" * 30000}).encode()
    r = httpx.post(
        f"{limited_server.url}/reward/schema", content=big, headers={**AUTH, "content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert r.json()["detail"]["content_length"] == len(big)

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    r = httpx.post(
        f"{limited_server.url}/reward/schema", content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert metric(limited_server.url, "reward_api_failures_total", {"cls": "body_too_large"}) == before + 2
    small = b'{"items": []}'
    r = httpx.post(
        f"{limited_server.url}/reward/schema",
        content=iter([small]),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["count"] == 0

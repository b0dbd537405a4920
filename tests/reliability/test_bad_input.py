"""Bad input: schemathesis against the live ``/openapi.json`` and hypothesis-generated payloads.

Expected: never a 5xx; every 4xx is an ``ErrorBody`` whose detail names the offending field (a 422's
``detail`` is a list of ``{"field", "message", "type"}``; a 413 names ``items`` or the body limit).
The pipeline endpoint sits on a fault injector in ``ok`` mode (fixed NDJSON), so a 5xx there would
be the service's own bug, not a missing executor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.result import Ok

from shared import GoldenExample, canonical_schema_json
from tests.helpers.faulty_executor import FaultyExecutor
from tests.helpers.servers import RewardApiServer
from tests.reliability.conftest import Scale, full_text, reward_problems

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def fuzz_api() -> Iterator[RewardApiServer]:
    env = {
        "REWARD_API_MAX_ITEMS": "64",
        "REWARD_API_MAX_TEXT_CHARS": "5000",
        "REWARD_API_EXECUTOR_TIMEOUT_S": "5",
        "REWARD_API_LOG_LEVEL": "WARNING",
    }
    with (
        FaultyExecutor(mode="ok", content='{"name": "x"}') as ex,
        RewardApiServer({**env, "REWARD_API_EXECUTOR_URLS": ex.url}) as api,
    ):
        yield api


def problems(status: int, body: Any, endpoint: str | None = None, request: Any = None) -> list[str]:
    """Why an answer breaks the contract for bad input (empty: it holds). A 200 of a /reward/* endpoint
    must have every reward finite and within its config's bounds."""
    if status >= 500:
        return [f"server error {status}: {str(body)[:200]}"]
    if status < 400:
        if endpoint is not None and status == 200:
            config = request.get("config") if isinstance(request, dict) else None
            return reward_problems(endpoint, config, body)
        return []
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return [f"{status} without an ErrorBody: {str(body)[:200]}"]
    detail = body.get("detail")
    if status == 422:
        if not isinstance(detail, list) or not detail:
            return [f"422 without a field list: {detail!r}"]
        return [f"422 entry without a field: {d!r}" for d in detail if not (isinstance(d, dict) and d.get("field"))]
    if status == 413:
        named = isinstance(detail, dict) and bool(detail.get("field") or detail.get("limit_bytes"))
        return [] if named or isinstance(detail, str) else [f"413 that names nothing: {detail!r}"]
    return []


def _as_json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _fuzz_operation(
    op: Any, mode: schemathesis.GenerationMode, examples: int, seen: dict[str, int], failures: list[str]
) -> None:
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(timeout=30)
        seen[str(response.status_code)] = seen.get(str(response.status_code), 0) + 1
        endpoint = op.path.rsplit("/", 1)[-1] if op.path.startswith("/reward/") else None
        for p in problems(response.status_code, _as_json(response), endpoint, case.body):
            failures.append(f"{op.method.upper()} {op.path} ({mode.value}): {p}")

    run()


def test_schemathesis_openapi(fuzz_api: RewardApiServer, scale: Scale, record_property: Any) -> None:
    """Schemathesis: every operation of the live /openapi.json, schema-valid and schema-violating cases."""
    schema = schemathesis.openapi.from_url(f"{fuzz_api.url}/openapi.json")
    seen: dict[str, int] = {}
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"/openapi.json has an invalid operation: {result}"
        operations.append(result.ok())
    for op in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if op.method.upper() == "POST":
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:
            _fuzz_operation(op, mode, scale.fuzz_examples, seen, failures)
    record_property(
        "tried", f"schemathesis on {len(operations)} operations, positive + negative, ≤{scale.fuzz_examples} cases each"
    )
    record_property("expected", "no 5xx; every 4xx an ErrorBody naming the field")
    record_property("observed", f"status counts {dict(sorted(seen.items()))}; contract breaks: {len(failures)}")
    assert sum(seen.values()) > 0
    assert failures == [], failures[:10]


# Full Unicode in keys and strings, lone surrogates included; NaN and ±Infinity are written as JSON
# literals (json.dumps allows them), as a careless client would.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | full_text(20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(full_text(10), inner, max_size=4),
    max_leaves=12,
)


def test_hypothesis_arbitrary_json(fuzz_api: RewardApiServer, scale: Scale, record_property: Any) -> None:
    """Arbitrary JSON values (and non-JSON bytes) as bodies of every /reward/* endpoint."""
    seen: dict[int, int] = {}
    failures: list[str] = []
    with httpx.Client(timeout=30) as client:

        @settings(
            max_examples=scale.fuzz_examples * 2, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            endpoint=st.sampled_from(["schema", "table", "pipeline"]),
            body=json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64),
        )
        def run(endpoint: str, body: bytes) -> None:
            r = client.post(
                f"{fuzz_api.url}/reward/{endpoint}", content=body, headers={"content-type": "application/json"}
            )
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            sent = json.loads(body) if r.status_code == 200 else None  # a 200 had valid JSON
            failures.extend(
                f"/reward/{endpoint} {body[:60]!r}: {p}" for p in problems(r.status_code, _as_json(r), endpoint, sent)
            )

        run()
    record_property("expected", "4xx naming the field (422 for wrong shapes), never 5xx")
    record_property("observed", f"status counts {dict(sorted(seen.items()))}; contract breaks: {len(failures)}")
    assert failures == [], failures[:10]
    assert 422 in seen


_BAD_VALUES: list[Any] = [None, 7, 1.5, True, [], {}, ["x"], {"a": 1}]
_FIELDS = {
    "schema": ["id", "prediction", "gold_schema"],
    "table": ["id", "prediction", "gold_table"],
    "pipeline": ["id", "prediction", "text", "gold_schema", "gold_table"],
}


def _valid_item(ex: GoldenExample, i: int) -> dict[str, Any]:
    return {
        "id": f"x{i}",
        "prediction": canonical_schema_json(ex.schema_dict()),
        "text": ex.text,
        "gold_schema": ex.schema_dict(),
        "gold_table": ex.table_dict(),
    }


def test_hypothesis_broken_field_is_named(
    fuzz_api: RewardApiServer, examples: list[GoldenExample], scale: Scale, record_property: Any
) -> None:
    """Valid batches with one field of one item broken (wrong type, missing, or an unknown extra key)."""
    checked = 0
    failures: list[str] = []
    with httpx.Client(timeout=30) as client:

        @settings(
            max_examples=scale.fuzz_examples * 2, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            endpoint=st.sampled_from(sorted(_FIELDS)),
            n=st.integers(1, 5),
            data=st.data(),
        )
        def run(endpoint: str, n: int, data: st.DataObject) -> None:
            nonlocal checked
            items = [{k: v for k, v in _valid_item(examples[i], i).items() if k in _FIELDS[endpoint]} for i in range(n)]
            k = data.draw(st.integers(0, n - 1), label="item")
            how = data.draw(st.sampled_from(["type", "missing", "extra"]), label="how")
            field = data.draw(st.sampled_from(_FIELDS[endpoint]), label="field")
            if how == "type":
                bad = data.draw(st.sampled_from(_BAD_VALUES), label="value")
                if field.startswith("gold_") and isinstance(bad, dict) and not bad:
                    bad = {"columns": "nope"}
                items[k][field] = bad
                want = f"items[{k}].{field}"
            elif how == "missing":
                del items[k][field]
                want = f"items[{k}].{field}"
            else:
                field = "predicton"  # a misspelt key must be rejected, not ignored
                items[k][field] = "x"
                want = f"items[{k}].predicton"
            r = client.post(f"{fuzz_api.url}/reward/{endpoint}", json={"items": items})
            body = _as_json(r)
            checked += 1
            if r.status_code != 422:
                failures.append(f"{endpoint} {how} {want}: {r.status_code} (want 422)")
                return
            named = [d.get("field", "") for d in body.get("detail", [])]
            if not any(f == want or f.startswith(want + ".") or f.startswith(want + "[") for f in named):
                failures.append(f"{endpoint} {how} {want}: 422 names {named}")

        run()
    record_property("expected", "422 whose detail names exactly items[k].<field>")
    record_property("observed", f"{checked} broken batches; misnamed or not 422: {len(failures)}")
    assert failures == [], failures[:10]

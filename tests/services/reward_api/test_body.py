"""The hot-path body reader (``services.reward_api.body``) against the pydantic wire models it mirrors.

No server: the readers are called on raw bytes. The fast structs must accept only what the pydantic
models accept, with the same values, and the results the routes encode must be the models' JSON.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.reward_api.body import (
    FastGoldSchema,
    FastGoldTable,
    FastPipelineItem,
    FastPipelineRequest,
    FastSchemaItem,
    FastSchemaRequest,
    FastTableItem,
    FastTableRequest,
    parse_slow,
)
from services.reward_api.errors import ApiError
from shared import (
    GoldenExample,
    GoldSchema,
    GoldTable,
    PipelineSchemaRewardConfig,
    SchemaRewardConfig,
    TableRewardConfig,
    compute_schema_reward_single,
    compute_table_reward_single,
    read_split,
)
from shared.rewards import combine_pipeline_reward, pipeline_reward_for_invalid_schema
from shared.wire import (
    PipelineDebug,
    PipelineItem,
    PipelineRequest,
    PipelineResult,
    SchemaItem,
    SchemaRequest,
    SchemaResult,
    TableItem,
    TableRequest,
    TableResult,
)


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__)


@pytest.mark.parametrize(
    ("struct", "model"),
    [
        (FastSchemaRequest, SchemaRequest),
        (FastTableRequest, TableRequest),
        (FastPipelineRequest, PipelineRequest),
        (FastSchemaItem, SchemaItem),
        (FastTableItem, TableItem),
        (FastPipelineItem, PipelineItem),
        (FastGoldSchema, GoldSchema),
        (FastGoldTable, GoldTable),
    ],
)
def test_fast_structs_have_the_models_fields(struct: type[msgspec.Struct], model: type[Any]) -> None:
    assert _fields(struct) == set(model.model_fields)


def test_result_rows_are_the_result_models(golden_dir: Path) -> None:
    ex = next(e for e in read_split(golden_dir, "test", limit=50) if e.table.data)
    s = compute_schema_reward_single("not json", ex.schema_dict())
    t = compute_table_reward_single('{"a": "1"}', ex.table_dict())
    for model, row in ((SchemaResult, SchemaResult.row("x", s)), (TableResult, TableResult.row("y", t))):
        assert list(row) == list(model.model_fields)
        assert json.loads(msgspec.json.encode(row)) == json.loads(model.model_validate(row).model_dump_json())


def test_pipeline_result_rows_are_the_result_model(golden_dir: Path) -> None:
    """``PipelineResult.row`` (what /reward/pipeline encodes) is the model's JSON, key for key and in order,
    with and without the aligned metrics, the debug view and the prompt-length fields."""
    ex = next(e for e in read_split(golden_dir, "test", limit=50) if e.table.data)
    schema = compute_schema_reward_single(json.dumps(ex.schema_.names()), ex.schema_dict())
    scored = combine_pipeline_reward(schema, compute_table_reward_single('{"a": "1"}', ex.table_dict()))
    invalid = pipeline_reward_for_invalid_schema(compute_schema_reward_single("{", ex.schema_dict()), ex.table_dict())
    views = [None, PipelineDebug.row(), PipelineDebug.row([{"role": "user", "content": "x"}], "out", True)]
    for reward in (scored, invalid):
        for view in views:
            for tokens, limit in ((None, None), (3000, 2048)):
                row = PipelineResult.row("i", reward, view, tokens, limit)
                debug = PipelineDebug.model_validate(view) if view is not None else None
                model = PipelineResult.of("i", reward, debug, prompt_tokens=tokens, prompt_limit=limit)
                assert list(row) == list(PipelineResult.model_fields)
                assert view is None or list(view) == list(PipelineDebug.model_fields)
                assert msgspec.json.encode(row) == model.model_dump_json().encode()


_cell = st.none() | st.text(max_size=4)
_name = st.text(max_size=4)
_column = st.fixed_dictionaries({"name": _name}) | st.just({"name": 3}) | st.just({})
_gold = st.fixed_dictionaries(
    {"columns": st.lists(_column, max_size=3)},
    optional={"table_id": st.none() | st.text(max_size=3) | st.just(7), "data": st.lists(st.lists(_cell, max_size=3))},
)
_item = st.fixed_dictionaries(
    {"id": st.text(max_size=3) | st.just(5), "prediction": st.text(max_size=5)},
    optional={"gold_schema": _gold, "gold_table": _gold, "text": st.text(max_size=5) | st.just(1), "extra": st.just(1)},
)
_config = st.fixed_dictionaries(
    {}, optional={"min_reward": st.floats(-2, 2) | st.just("x"), "max_reward": st.floats(-2, 2), "nope": st.just(1)}
)
_body = st.fixed_dictionaries(
    {"items": st.lists(_item, max_size=3)},
    optional={
        "config": _config,
        "debug": st.booleans() | st.just("yes"),
        "on_executor_error": st.sampled_from(["fail", "penalize", "retry"]),
    },
)
_REQUESTS = {
    "schema": (FastSchemaRequest, SchemaRequest, SchemaRewardConfig),
    "table": (FastTableRequest, TableRequest, TableRewardConfig),
    "pipeline": (FastPipelineRequest, PipelineRequest, PipelineSchemaRewardConfig),
}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_body, kind=st.sampled_from(sorted(_REQUESTS)))
def test_fast_path_accepts_only_what_the_models_accept(body: dict[str, Any], kind: str) -> None:
    """Whatever the fast structs accept, the pydantic model accepts with the same items and config (the
    reverse need not hold: the routes send what the fast path refuses to the slow path)."""
    struct, model, cfg_model = _REQUESTS[kind]
    raw = json.dumps(body).encode()
    try:
        fast = msgspec.json.decode(raw, type=struct)
        cfg = cfg_model.model_validate(fast.config)
    except (ValueError, msgspec.ValidationError):
        # Refused by the fast path: the slow path answers (an error, or pydantic's laxer reading).
        with contextlib.suppress(RequestValidationError, ApiError):
            parse_slow(raw, model)
        return
    slow = parse_slow(raw, model)
    assert slow.config == cfg and slow.debug == fast.debug
    if kind == "pipeline":
        assert slow.on_executor_error == fast.on_executor_error
    golds = {"schema": ["gold_schema"], "table": ["gold_table"], "pipeline": ["gold_schema", "gold_table"]}[kind]
    for f, s in zip(fast.items, slow.items, strict=True):
        assert (f.id, f.prediction) == (s.id, s.prediction)
        if kind == "pipeline":
            assert f.text == s.text
        for gold in golds:
            assert getattr(f, gold).names() == getattr(s, gold).names()
        if kind != "schema":
            assert f.gold_table.data == s.gold_table.data


def test_fast_and_model_items_score_the_same(golden_dir: Path) -> None:
    examples: list[GoldenExample] = list(read_split(golden_dir, "test", limit=40))
    rng = random.Random(0)
    items = [
        {"id": e.id, "prediction": rng.choice(["{}", json.dumps(e.schema_.names())]), "gold_table": e.table_dict()}
        for e in examples
    ]
    raw = json.dumps({"items": items}).encode()
    fast = msgspec.json.decode(raw, type=FastTableRequest)
    slow = parse_slow(raw, TableRequest)
    from services.reward_api.scoring import score_table_batch

    cfg = TableRewardConfig()
    assert score_table_batch(fast.items, cfg) == score_table_batch(slow.items, cfg)

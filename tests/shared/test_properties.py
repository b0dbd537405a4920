"""Property-based checks of the metric and reward invariants."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shared import (
    PipelineSchemaRewardConfig,
    SchemaRewardConfig,
    TableRewardConfig,
    aligned_table_metrics,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    schema_prf_from_text,
)

names = st.lists(st.text(alphabet="abcdefgxyz_ ", min_size=1, max_size=8), min_size=1, max_size=8, unique=True)
cells = st.one_of(st.none(), st.text(max_size=6))


@st.composite
def tables(draw: st.DrawFn) -> dict:
    cols = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=5, unique=True))
    data = draw(st.lists(st.lists(cells, min_size=len(cols), max_size=len(cols)), max_size=6))
    return {"columns": [{"name": c} for c in cols], "data": data}


@given(names, names, st.randoms())
def test_f1_permutation_invariant(pred: list[str], gold: list[str], rnd) -> None:
    gold_schema = {"columns": [{"name": n} for n in gold]}
    a = schema_prf_from_text(json.dumps(pred), gold_schema)
    shuffled = pred[:]
    rnd.shuffle(shuffled)
    gs = gold[:]
    rnd.shuffle(gs)
    b = schema_prf_from_text(json.dumps(shuffled), {"columns": [{"name": n} for n in gs]})
    assert (a.precision, a.recall, a.f1) == (b.precision, b.recall, b.f1)


@given(tables(), st.randoms())
@settings(max_examples=60)
def test_aligned_metrics_row_order_invariant(table: dict, rnd) -> None:
    cols = [c["name"] for c in table["columns"]]
    rows = [dict(zip(cols, r, strict=True)) for r in table["data"]]
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    assert aligned_table_metrics(shuffled, rows, cols) == aligned_table_metrics(rows, rows, cols)
    m = aligned_table_metrics(shuffled, rows, cols)
    assert m.cell_f1 == 1.0 and m.aligned_cell_accuracy == 1.0 and m.row_exact_match == 1.0


weights = st.floats(-3, 3, allow_nan=False)
bounds = st.tuples(st.floats(-5, 0, allow_nan=False), st.floats(0, 5, allow_nan=False))


@given(st.text(max_size=60), names, weights, weights, weights, bounds, st.floats(-10, 10, allow_nan=False))
def test_schema_reward_in_bounds(text, gold, w1, w2, w3, b, pen) -> None:
    cfg = SchemaRewardConfig(
        f1_weight=w1, precision_weight=w2, recall_weight=w3, min_reward=b[0], max_reward=b[1], invalid_json_penalty=pen
    )
    r = compute_schema_reward_single(text, {"columns": gold}, cfg)
    assert cfg.min_reward <= r.reward <= cfg.max_reward


@given(st.text(max_size=80), tables(), bounds)
def test_table_reward_in_bounds(text, table, b) -> None:
    cfg = TableRewardConfig(min_reward=b[0], max_reward=b[1])
    r = compute_table_reward_single(text, table, cfg)
    assert cfg.min_reward <= r.reward <= cfg.max_reward


@given(tables(), names, st.floats(0, 1))
def test_perfect_prediction_gets_max(table, gold_names, a) -> None:
    t = compute_table_reward_single(gold_ndjson(table), table)
    s = compute_schema_reward_single(json.dumps(gold_names), {"columns": gold_names})
    assert t.reward == TableRewardConfig().max_reward and t.cell_accuracy == 1.0
    assert s.reward == SchemaRewardConfig().max_reward
    assert combine_pipeline_reward(s, t, PipelineSchemaRewardConfig(schema_weight=a)).reward == 1.0

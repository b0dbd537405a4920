import math

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import (
    PipelineSchemaRewardConfig,
    SchemaRewardConfig,
    TableRewardConfig,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    pipeline_reward_for_executor_failure,
    pipeline_reward_for_invalid_schema,
    pipeline_reward_for_prompt_too_long,
)
from shared.rewards import RewardBounds

SCHEMA = {"columns": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]}
TABLE = {"columns": [{"name": "a"}, {"name": "b"}], "data": [["1", "2"], ["3", None]]}


def test_schema_defaults_are_f1() -> None:
    r = compute_schema_reward_single('["a", "b", "x"]', SCHEMA)
    # P = 2/3, R = 1/2, F1 = 4/7
    assert r.reward == pytest.approx(4 / 7)
    assert (r.valid_json, r.error) == (True, None)


def test_schema_weights() -> None:
    cfg = SchemaRewardConfig(f1_weight=0.0, precision_weight=0.5, recall_weight=0.5)
    assert compute_schema_reward_single('["a", "b", "x"]', SCHEMA, cfg).reward == pytest.approx(0.5 * 2 / 3 + 0.25)


def test_schema_clip_and_penalty() -> None:
    cfg = SchemaRewardConfig(f1_weight=3.0)
    assert compute_schema_reward_single('["a","b","c","d"]', SCHEMA, cfg).reward == 1.0
    r = compute_schema_reward_single("nope", SCHEMA)
    assert (r.reward, r.valid_json, r.error) == (-1.0, False, "invalid_json")
    assert compute_schema_reward_single("nope", SCHEMA, SchemaRewardConfig(invalid_json_penalty=-5)).reward == -1.0
    assert compute_schema_reward_single("nope", SCHEMA, SchemaRewardConfig(invalid_json_penalty=-0.3)).reward == -0.3


POSITIONAL = TableRewardConfig(table_metric="positional")


def test_table_linear_map_positional() -> None:
    r = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}', TABLE, POSITIONAL)
    assert r.cell_accuracy == r.score == 0.75 and r.metric == "positional"
    assert r.reward == pytest.approx(-1 + 2 * 0.75)
    r2 = compute_table_reward_single(
        '{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}',
        TABLE,
        TableRewardConfig(table_metric="positional", min_reward=0, max_reward=1),
    )
    assert r2.reward == 0.75


def test_table_default_is_aligned_cell_f1() -> None:
    # 4 non-empty predicted cells, 3 non-empty gold cells, 3 match: F1 = 2·3 / (4 + 3) = 6/7
    r = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}', TABLE)
    assert r.metric == "aligned" and r.score == pytest.approx(6 / 7)
    assert r.aligned is not None and r.aligned.cell_f1 == r.score
    assert r.reward == pytest.approx(-1 + 2 * 6 / 7)
    assert r.cell_accuracy == 0.75  # the original positional number is still reported
    no_extras = compute_table_reward_single(
        '{"a": "1"}\n{"a": "3", "b": "x"}', TABLE, TableRewardConfig(aligned_metrics=False)
    )
    assert no_extras.aligned is None and no_extras.score == pytest.approx(2 * 2 / (3 + 3))


def test_table_default_ignores_null_padding_and_row_order() -> None:
    base = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}', TABLE)
    padded = compute_table_reward_single('{"a": "1", "b": "2", "z": null}\n{"a": "3", "b": "x", "z": null}', TABLE)
    swapped = compute_table_reward_single('{"A": "3", "B": "x"}\n{"b": "2", "a": "1"}', TABLE)
    assert padded.reward == base.reward == swapped.reward
    # the original positional metric pays for the same padding: null == null counts as a correct cell
    pos_base = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}', TABLE, POSITIONAL)
    pos_padded = compute_table_reward_single(
        '{"a": "1", "b": "2", "z": null}\n{"a": "3", "b": "x", "z": null}', TABLE, POSITIONAL
    )
    assert pos_padded.reward > pos_base.reward


def test_table_json_numbers_and_booleans_match_their_text() -> None:
    gold = {"columns": ["p", "q", "r"], "data": [["1.50", "true", "7"]]}
    r = compute_table_reward_single('{"p": 1.50, "q": true, "r": 7}', gold)
    assert r.score == 1.0 and r.cell_accuracy == 1.0
    assert compute_table_reward_single('{"p": 1.5, "q": "True", "r": 7.0}', gold).score == 0.0


def test_table_metric_must_be_known() -> None:
    with pytest.raises(ValueError, match="table_metric"):
        TableRewardConfig.model_validate({"table_metric": "union"})


def test_table_invalid_and_perfect() -> None:
    bad = compute_table_reward_single('{"a": "1"}\nnot json', TABLE)
    assert (bad.reward, bad.valid_json, bad.error) == (-1.0, False, "invalid_ndjson")
    good = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": null}', TABLE)
    assert good.reward == 1.0 and good.aligned is not None and good.aligned.cell_f1 == 1.0


def test_table_aligned_can_be_switched_off() -> None:
    r = compute_table_reward_single('{"a": "1", "b": "2"}', TABLE, TableRewardConfig(aligned_metrics=False))
    assert r.aligned is None


def test_pipeline_combination() -> None:
    s = compute_schema_reward_single('["a", "b", "c", "d"]', SCHEMA)  # 1.0
    t = compute_table_reward_single('{"a": "1", "b": "2"}\n{"a": "3", "b": "x"}', TABLE, POSITIONAL)  # 0.5
    assert combine_pipeline_reward(s, t).reward == pytest.approx(0.75)
    cfg = PipelineSchemaRewardConfig(schema_weight=0.2)
    assert combine_pipeline_reward(s, t, cfg).reward == pytest.approx(0.2 + 0.8 * 0.5)
    clipped = PipelineSchemaRewardConfig(max_reward=0.6)
    assert combine_pipeline_reward(s, t, clipped).reward == 0.6


def test_pipeline_invalid_schema_takes_both_penalties() -> None:
    s = compute_schema_reward_single("garbage", SCHEMA)
    r = pipeline_reward_for_invalid_schema(s, TABLE)
    assert r.reward == -1.0 and r.table.reward == -1.0 and r.error == "invalid_json"
    cfg = PipelineSchemaRewardConfig(
        schema_reward=SchemaRewardConfig(invalid_json_penalty=-0.5),
        table_reward=TableRewardConfig(invalid_json_penalty=-0.2),
    )
    s2 = compute_schema_reward_single("garbage", SCHEMA, cfg.schema_reward)
    assert pipeline_reward_for_invalid_schema(s2, TABLE, cfg).reward == pytest.approx(0.5 * -0.5 + 0.5 * -0.2)


def test_executor_failure_is_labelled() -> None:
    s = compute_schema_reward_single('["a"]', SCHEMA)
    r = pipeline_reward_for_executor_failure(s, TABLE)
    assert r.error == "executor_failed" and r.table.error == "executor_failed"


def test_configs_reject_unknown_keys_and_bad_bounds() -> None:
    with pytest.raises(pydantic.ValidationError, match="f1_wieght"):
        SchemaRewardConfig.model_validate({"f1_wieght": 1})
    with pytest.raises(pydantic.ValidationError, match="min_reward"):
        TableRewardConfig(min_reward=2, max_reward=1)
    with pytest.raises(pydantic.ValidationError, match="schema_weight"):
        PipelineSchemaRewardConfig(schema_weight=1.5)


CONFIGS = (SchemaRewardConfig, TableRewardConfig, PipelineSchemaRewardConfig)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["min_reward", "max_reward"])
def test_configs_reject_non_finite_numbers(config: type[RewardBounds], value: float, field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"{field}\n.*finite number"):
        config.model_validate({field: value})


@pytest.mark.parametrize("config", CONFIGS)
def test_one_bounds_validator_for_every_config(config: type[RewardBounds]) -> None:
    assert issubclass(config, RewardBounds)
    with pytest.raises(pydantic.ValidationError, match="min_reward must not exceed max_reward"):
        config.model_validate({"min_reward": 1, "max_reward": 0})
    with pytest.raises(pydantic.ValidationError, match="must be a finite number"):
        config.model_validate({"min_reward": -1e308, "max_reward": 1e308})


def test_weights_and_penalties_must_be_finite() -> None:
    for cfg in ({"f1_weight": math.nan}, {"invalid_json_penalty": math.inf}):
        with pytest.raises(pydantic.ValidationError, match="finite number"):
            SchemaRewardConfig.model_validate(cfg)
    with pytest.raises(pydantic.ValidationError, match="finite number"):
        PipelineSchemaRewardConfig.model_validate({"table_reward": {"max_reward": math.nan}})


_finite = st.floats(allow_nan=False, allow_infinity=False)


@given(lo=_finite, hi=_finite, w=_finite, acc_pred=st.sampled_from(['["a"]', '["a", "b", "c", "d"]', "nope"]))
def test_any_accepted_config_gives_a_finite_reward_within_bounds(lo: float, hi: float, w: float, acc_pred: str) -> None:
    try:
        cfg = SchemaRewardConfig(min_reward=lo, max_reward=hi, f1_weight=w, precision_weight=w)
        tcfg = TableRewardConfig(min_reward=lo, max_reward=hi)
    except pydantic.ValidationError:
        return
    for r in (compute_schema_reward_single(acc_pred, SCHEMA, cfg).reward, compute_table_reward_single(
        '{"a": "1", "b": "2"}', TABLE, tcfg
    ).reward):  # fmt: skip
        assert math.isfinite(r) and lo <= r <= hi


def test_prompt_too_long_is_labelled_and_keeps_the_schema_part() -> None:
    s = compute_schema_reward_single('["a", "b"]', SCHEMA)
    r = pipeline_reward_for_prompt_too_long(s, TABLE)
    assert r.error == "prompt_too_long" and r.table.error == "prompt_too_long" and not r.table.valid_json
    assert r.schema == s and r.reward == pytest.approx(0.5 * s.reward + 0.5 * -1.0)


def test_seed_defaults() -> None:
    s, t, p = SchemaRewardConfig(), TableRewardConfig(), PipelineSchemaRewardConfig()
    assert (s.f1_weight, s.precision_weight, s.recall_weight, s.invalid_json_penalty) == (1, 0, 0, -1)
    assert (s.min_reward, s.max_reward, t.min_reward, t.max_reward, t.invalid_json_penalty) == (-1, 1, -1, 1, -1)
    assert (p.schema_weight, p.min_reward, p.max_reward) == (0.5, -1, 1)

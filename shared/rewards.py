"""Reward definitions (docs/rewards.md). Every number is a field of a config, with its default.

- Schema: ``f1_weight·F1 + precision_weight·P + recall_weight·R``; unparseable → ``invalid_json_penalty``;
  clipped to ``[min_reward, max_reward]``.
- Table: ``min_reward + (max_reward − min_reward)·score``; invalid NDJSON → ``invalid_json_penalty``. The score
  is chosen by ``table_metric``:

  - ``aligned`` (default): F1 over non-empty cells after one-to-one (Hungarian) row alignment, column
    names through ``normalize_name`` (as schema F1), values as ``normalize_cell``; an empty or null cell
    earns nothing and costs nothing. It equals Phase D's headline ``aligned_cell_f1``, so training and
    report agree. Why F1 and not accuracy over the gold cells plus a precision term: F1 needs no extra
    weight, is 1 only for a perfect table, and every worsening edit lowers it or leaves it unchanged:
    padding with null columns (unchanged), with invented values (precision falls), dropping, emptying
    or renaming a correct cell (recall falls, and an emptied correct cell lowers F1 because
    2·(tp−1)/(n−1+g) < 2·tp/(n+g) whenever tp < n + g), duplicating a row (precision falls). Equivalent
    predictions (row order, column order, name formatting) score the same. ``bench reward-audit``
    checks all of this on real data.
  - ``positional`` (the original metric, for comparison and ablations): ``cell_accuracy``, positional rows over the
    union of keys with literal names, where ``"" == ""`` counts as correct: on open-domain headers a
    null-filled junk column raises it (padding pays).
- Pipeline: ``a·schema + (1 − a)·table``, clipped. An invalid schema makes no executor call and both
  parts take their invalid penalties. The executor call itself lives in the reward service; this
  module holds only the pure combining step.

Configs reject unknown keys, so a typo in an override is an error, never a silent default. One
validator (``RewardBounds``) checks every config: finite numbers and ordered, finite clip bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.aligned_metrics import DEFAULT_MAX_ALIGN_ROWS, AlignedMetrics, aligned_cell_f1, aligned_table_metrics
from shared.schema_metrics import schema_prf
from shared.schema_parsing import ParsedSchema, parse_schema_text
from shared.table_metrics import cell_accuracy, gold_table_to_rows, parse_ndjson_detailed, table_column_names

INVALID_JSON: Final = "invalid_json"
INVALID_NDJSON = "invalid_ndjson"
EXECUTOR_FAILED = "executor_failed"
PROMPT_TOO_LONG = "prompt_too_long"
EXECUTOR_TRUNCATED = "executor_truncated"

TableMetric = Literal["aligned", "positional"]
TABLE_METRICS: tuple[TableMetric, ...] = ("aligned", "positional")


class RewardBounds(BaseModel):
    """The one validator of every reward config (schema, table, pipeline), so they cannot drift apart.

    Every number must be finite (``NaN`` or ``Infinity`` would make a reward ``NaN``, ``null`` or a clip
    bound that clips nothing), ``min_reward ≤ max_reward``, and ``max_reward − min_reward`` must itself be
    finite: the table reward is ``min + (max − min)·accuracy``, and an overflowing span gives ``NaN``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_reward: float = Field(-1.0, description="Lower clip bound of the reward.")
    max_reward: float = Field(1.0, description="Upper clip bound of the reward.")

    @model_validator(mode="after")
    def _bounds_ordered(self) -> RewardBounds:
        if self.min_reward > self.max_reward:
            raise ValueError("min_reward must not exceed max_reward")
        if not math.isfinite(self.max_reward - self.min_reward):
            raise ValueError("max_reward - min_reward must be a finite number")
        return self

    def clip(self, value: float) -> float:
        return min(self.max_reward, max(self.min_reward, value))


class _RewardConfig(RewardBounds):
    invalid_json_penalty: float = Field(-1.0, description="Reward for output that does not parse.")


class SchemaRewardConfig(_RewardConfig):
    """Schema reward weights (defaults: reward = F1)."""

    f1_weight: float = Field(1.0, description="Weight of schema F1.")
    precision_weight: float = Field(0.0, description="Weight of schema precision.")
    recall_weight: float = Field(0.0, description="Weight of schema recall.")


class TableRewardConfig(_RewardConfig):
    """Table reward: the ``table_metric`` score mapped linearly onto [min_reward, max_reward]."""

    table_metric: TableMetric = Field(
        "aligned",
        description="'aligned' (default): cell F1 after Hungarian row alignment, names normalised, empty cells "
        "earn nothing (= Phase D's aligned_cell_f1). 'positional': the original positional cell accuracy.",
    )
    aligned_metrics: bool = Field(
        True, description="Also report every order-invariant metric (the result's 'aligned' field)."
    )


class PipelineSchemaRewardConfig(RewardBounds):
    """Pipeline reward: ``schema_weight·schema + (1 − schema_weight)·table``, clipped."""

    schema_weight: float = Field(0.5, ge=0.0, le=1.0, description="Weight a of the schema part.")
    min_reward: float = Field(-1.0, description="Lower clip bound of the combined reward.")
    max_reward: float = Field(1.0, description="Upper clip bound of the combined reward.")
    schema_reward: SchemaRewardConfig = Field(default_factory=SchemaRewardConfig, description="Schema part.")
    table_reward: TableRewardConfig = Field(default_factory=TableRewardConfig, description="Table part.")


@dataclass(frozen=True, slots=True)
class SchemaReward:
    reward: float
    valid_json: bool
    precision: float
    recall: float
    f1: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TableReward:
    """``score`` is what the reward maps (the ``metric``'s number); ``cell_accuracy`` is always the
    original positional accuracy, reported whichever metric is chosen."""

    reward: float
    valid_json: bool
    cell_accuracy: float
    n_pred_rows: int
    n_gold_rows: int
    error: str | None = None
    aligned: AlignedMetrics | None = None
    score: float = 0.0
    metric: str = "aligned"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PipelineReward:
    reward: float
    schema: SchemaReward
    table: TableReward
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute_schema_reward_single(
    prediction: str, gold_schema: Mapping[str, Any] | list[Any], config: SchemaRewardConfig | None = None
) -> SchemaReward:
    """Score one predicted schema text against its gold schema."""
    return compute_schema_reward_parsed(parse_schema_text(prediction), gold_schema, config)


def compute_schema_reward_parsed(
    parsed: ParsedSchema, gold_schema: Mapping[str, Any] | list[Any], config: SchemaRewardConfig | None = None
) -> SchemaReward:
    """:func:`compute_schema_reward_single` on a prediction already parsed (``parse_schema_text``, or the
    ``schema`` of ``shared.stage2_handoff``): the same reward, without parsing the text again."""
    cfg = config or SchemaRewardConfig()
    m = schema_prf(parsed, gold_schema)
    if not m.valid_json:
        return SchemaReward(cfg.clip(cfg.invalid_json_penalty), False, 0.0, 0.0, 0.0, INVALID_JSON)
    raw = cfg.f1_weight * m.f1 + cfg.precision_weight * m.precision + cfg.recall_weight * m.recall
    return SchemaReward(cfg.clip(raw), True, m.precision, m.recall, m.f1)


def invalid_table_reward(config: TableRewardConfig, n_gold_rows: int, error: str) -> TableReward:
    """The table reward for output that could not be scored (invalid NDJSON, or no table at all)."""
    return TableReward(
        config.clip(config.invalid_json_penalty), False, 0.0, 0, n_gold_rows, error, metric=config.table_metric
    )


def compute_table_reward_single(
    prediction: str,
    gold_table: Mapping[str, Any],
    config: TableRewardConfig | None = None,
    max_align_rows: int = DEFAULT_MAX_ALIGN_ROWS,
) -> TableReward:
    """Score one predicted NDJSON table against its gold table.

    ``max_align_rows`` bounds the row alignment's cost (server configuration, not a reward knob: a
    request cannot raise it)."""
    cfg = config or TableRewardConfig()
    gold_rows = gold_table_to_rows(gold_table)
    parsed = parse_ndjson_detailed(prediction)
    if not parsed.valid:
        return invalid_table_reward(cfg, len(gold_rows), INVALID_NDJSON)
    acc = cell_accuracy(parsed.rows, gold_rows)
    aligned = (
        aligned_table_metrics(parsed.rows, gold_rows, table_column_names(gold_table), max_align_rows)
        if cfg.aligned_metrics
        else None
    )
    if cfg.table_metric == "positional":
        score = acc
    else:
        score = aligned.cell_f1 if aligned is not None else aligned_cell_f1(parsed.rows, gold_rows, max_align_rows)
    reward = cfg.clip(cfg.min_reward + (cfg.max_reward - cfg.min_reward) * score)
    return TableReward(reward, True, acc, len(parsed.rows), len(gold_rows), None, aligned, score, cfg.table_metric)


def combine_pipeline_reward(
    schema: SchemaReward, table: TableReward, config: PipelineSchemaRewardConfig | None = None, error: str | None = None
) -> PipelineReward:
    """The pure combining step of the pipeline reward: ``a·schema + (1 − a)·table``, clipped."""
    cfg = config or PipelineSchemaRewardConfig()
    a = cfg.schema_weight
    return PipelineReward(cfg.clip(a * schema.reward + (1 - a) * table.reward), schema, table, error)


def pipeline_reward_without_table(
    schema: SchemaReward, gold_table: Mapping[str, Any], error: str, config: PipelineSchemaRewardConfig | None = None
) -> PipelineReward:
    """An item that has no table to score: the table part takes its invalid penalty, the schema part keeps its
    own reward, and ``error`` says why (the four cases below)."""
    cfg = config or PipelineSchemaRewardConfig()
    table = invalid_table_reward(cfg.table_reward, len(gold_table.get("data", [])), error)
    return combine_pipeline_reward(schema, table, cfg, error)


def pipeline_reward_for_invalid_schema(
    schema: SchemaReward, gold_table: Mapping[str, Any], config: PipelineSchemaRewardConfig | None = None
) -> PipelineReward:
    """Both parts take their invalid penalties; no executor call is made."""
    return pipeline_reward_without_table(schema, gold_table, INVALID_JSON, config)


def pipeline_reward_for_executor_failure(
    schema: SchemaReward, gold_table: Mapping[str, Any], config: PipelineSchemaRewardConfig | None = None
) -> PipelineReward:
    """Opt-in penalty when the executor failed: the table part takes its invalid penalty and the
    result carries ``error="executor_failed"`` so it is never mistaken for a wrong answer."""
    return pipeline_reward_without_table(schema, gold_table, EXECUTOR_FAILED, config)


def pipeline_reward_for_prompt_too_long(
    schema: SchemaReward, gold_table: Mapping[str, Any], config: PipelineSchemaRewardConfig | None = None
) -> PipelineReward:
    """The Stage-2 prompt (document + predicted schema) does not fit the executor's context, so no table
    exists. The table part takes its invalid penalty like any item without a table, the schema part keeps
    its own reward, and ``error="prompt_too_long"`` tells it apart from a wrong answer and from a broken
    executor: the fix is in the data (drop or shorten the document), not in the policy or the infrastructure."""
    return pipeline_reward_without_table(schema, gold_table, PROMPT_TOO_LONG, config)


def pipeline_reward_for_executor_truncated(
    schema: SchemaReward, gold_table: Mapping[str, Any], config: PipelineSchemaRewardConfig | None = None
) -> PipelineReward:
    """The executor stopped at its token limit (``finish_reason="length"``), so its table is cut off. That is
    a configuration fault (the executor's ``max_tokens`` is too small for the table), not the policy's mistake:
    the table part takes its invalid penalty as for any item without a usable table, the schema part keeps its
    own reward, and ``error="executor_truncated"`` tells it apart from a wrong answer. The fix is to raise the
    executor's token limit."""
    return pipeline_reward_without_table(schema, gold_table, EXECUTOR_TRUNCATED, config)

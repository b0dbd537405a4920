"""Wire types of the reward API (docs/reward_api.md#contract): the service parses requests and answers with
them, and every caller talks through the typed client ``trainer/reward_client.py``, which builds its requests
from these models, parses each answer into the matching response model and checks the answer's
``prompt_version`` against the prompts the caller built its data with. A result field has one name on the
wire, in the client and in VERL's logs (except the reward itself, which VERL requires to be called ``score``).

Requests reject unknown keys, so a misspelt field or config override is a 422 that names it, and
non-finite numbers (``NaN``, ``Infinity``), so no reward can come back ``NaN`` or ``null``. Strings must
be valid Unicode: a lone UTF-16 surrogate (``"\\ud800"``) is a 422 naming its field (the service checks
the parsed body; Python models accept such strings, JSON encoders do not).
Results come back one per item, in request order.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.aligned_metrics import AlignedMetrics
from shared.golden import GoldSchema, GoldTable
from shared.rewards import (
    PipelineReward,
    PipelineSchemaRewardConfig,
    SchemaReward,
    SchemaRewardConfig,
    TableReward,
    TableRewardConfig,
)

# The name an executor serves its model under unless configured otherwise, and the name the reward API asks
# it for by default: the executor images (services/executor_vllm/entrypoint.py, which runs without this
# package, states it again; a test keeps the two equal), the CPU launcher, compose and the benches.
EXECUTOR_SERVED_NAME = "executor"
# The ports an executor and the reward API listen on unless configured otherwise: the launchers, the images and
# compose (the entrypoint, the Dockerfiles and compose state them again; a test keeps them equal).
EXECUTOR_PORT = 8001
REWARD_API_PORT = 8000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- items -------------------------------------------------------------------------------------


class SchemaItem(_Strict):
    id: str = Field(description="Caller's id, echoed in the result.")
    prediction: str = Field(description="π1 output: the predicted schema text.")
    gold_schema: GoldSchema


class TableItem(_Strict):
    id: str
    prediction: str = Field(description="π2 output: NDJSON rows.")
    gold_table: GoldTable


class PipelineItem(_Strict):
    id: str
    prediction: str = Field(description="π1 output: the predicted schema text.")
    text: str = Field(description="The document; the Stage-2 prompt is built from it.")
    gold_schema: GoldSchema
    gold_table: GoldTable


# ---- requests ----------------------------------------------------------------------------------


class SchemaRequest(_Strict):
    items: list[SchemaItem]
    config: SchemaRewardConfig = Field(default_factory=SchemaRewardConfig)
    debug: bool = False


class TableRequest(_Strict):
    items: list[TableItem]
    config: TableRewardConfig = Field(default_factory=TableRewardConfig)
    debug: bool = False


class PipelineRequest(_Strict):
    items: list[PipelineItem]
    config: PipelineSchemaRewardConfig = Field(default_factory=PipelineSchemaRewardConfig)
    debug: bool = False
    on_executor_error: Literal["fail", "penalize"] = Field(
        "fail",
        description="'fail': an executor failure answers 503. 'penalize': the item gets the penalty "
        "and error='executor_failed', counted in the response's 'failed'.",
    )


# ---- results -----------------------------------------------------------------------------------


class AlignedMetricsOut(BaseModel):
    aligned_cell_accuracy: float
    row_exact_match: float
    cell_precision: float
    cell_recall: float
    cell_f1: float
    cell_f1_normalized: float
    column_header_f1: float
    column_header_f1_normalized: float


def _aligned_out(a: AlignedMetrics | None) -> AlignedMetricsOut | None:
    return AlignedMetricsOut.model_construct(None, **a.as_dict()) if a is not None else None


class SchemaResult(BaseModel):
    id: str
    reward: float
    valid_json: bool
    precision: float
    recall: float
    f1: float
    error: str | None = None

    @staticmethod
    def row(item_id: str, r: SchemaReward) -> dict[str, Any]:
        """This result as the JSON object it is sent as. The service encodes these dicts directly: a model
        per item cost more than the scoring itself at batch 1024 (tests keep the keys equal to the fields)."""
        return {
            "id": item_id, "reward": r.reward, "valid_json": r.valid_json, "precision": r.precision,
            "recall": r.recall, "f1": r.f1, "error": r.error,
        }  # fmt: skip


class TableResult(BaseModel):
    id: str
    reward: float
    valid_json: bool
    table_score: float = Field(description="The table_metric's number that the reward maps onto [min, max].")
    table_metric: str = Field(description="Which metric made the reward: 'aligned' or 'positional'.")
    cell_accuracy: float = Field(description="The original positional cell accuracy (reported for every metric).")
    n_pred_rows: int
    n_gold_rows: int
    error: str | None = None
    aligned: AlignedMetricsOut | None = None

    @staticmethod
    def row(item_id: str, r: TableReward) -> dict[str, Any]:
        """This result as the JSON object it is sent as (see ``SchemaResult.row``)."""
        return {
            "id": item_id, "reward": r.reward, "valid_json": r.valid_json, "table_score": r.score,
            "table_metric": r.metric, "cell_accuracy": r.cell_accuracy,
            "n_pred_rows": r.n_pred_rows, "n_gold_rows": r.n_gold_rows, "error": r.error,
            "aligned": r.aligned.as_dict() if r.aligned is not None else None,
        }  # fmt: skip


class PipelineDebug(BaseModel):
    messages: list[dict[str, str]] | None = Field(None, description="The Stage-2 messages sent to the executor.")
    executor_output: str | None = Field(None, description="The executor's raw completion text.")
    cached: bool | None = Field(None, description="Whether the executor output came from the cache.")

    @staticmethod
    def row(
        messages: list[dict[str, str]] | None = None, executor_output: str | None = None, cached: bool | None = None
    ) -> dict[str, Any]:
        """This debug view as the JSON object it is sent as."""
        return {"messages": messages, "executor_output": executor_output, "cached": cached}


class PipelineResult(BaseModel):
    id: str
    reward: float
    schema_reward: float
    table_reward: float
    valid_json: bool = Field(description="Whether the predicted schema parsed.")
    table_valid_json: bool = Field(description="Whether the executor's table parsed.")
    precision: float
    recall: float
    f1: float
    table_score: float = Field(description="The table part's table_metric number (see TableResult.table_score).")
    table_metric: str = Field(description="Which metric made the table part: 'aligned' or 'positional'.")
    cell_accuracy: float
    error: str | None = None
    prompt_tokens: int | None = Field(
        None, description="error='prompt_too_long': the Stage-2 prompt's token count (when the executor gave it)."
    )
    prompt_limit: int | None = Field(
        None, description="error='prompt_too_long': the executor's context length (max_model_len)."
    )
    aligned: AlignedMetricsOut | None = None
    debug: PipelineDebug | None = None

    @staticmethod
    def row(
        item_id: str,
        r: PipelineReward,
        debug: dict[str, Any] | None = None,
        prompt_tokens: int | None = None,
        prompt_limit: int | None = None,
    ) -> dict[str, Any]:
        """This result as the JSON object it is sent as (see ``SchemaResult.row``); ``debug`` is a
        ``PipelineDebug`` as a dict (``PipelineDebug.row``)."""
        t, s = r.table, r.schema
        return {
            "id": item_id, "reward": r.reward, "schema_reward": s.reward, "table_reward": t.reward,
            "valid_json": s.valid_json, "table_valid_json": t.valid_json, "precision": s.precision,
            "recall": s.recall, "f1": s.f1, "table_score": t.score, "table_metric": t.metric,
            "cell_accuracy": t.cell_accuracy, "error": r.error,
            "prompt_tokens": prompt_tokens, "prompt_limit": prompt_limit,
            "aligned": t.aligned.as_dict() if t.aligned is not None else None, "debug": debug,
        }  # fmt: skip

    @classmethod
    def of(
        cls,
        item_id: str,
        r: PipelineReward,
        debug: PipelineDebug | None = None,
        prompt_tokens: int | None = None,
        prompt_limit: int | None = None,
    ) -> PipelineResult:
        t = r.table
        return cls(
            id=item_id,
            reward=r.reward,
            schema_reward=r.schema.reward,
            table_reward=t.reward,
            valid_json=r.schema.valid_json,
            table_valid_json=t.valid_json,
            precision=r.schema.precision,
            recall=r.schema.recall,
            f1=r.schema.f1,
            table_score=t.score,
            table_metric=t.metric,
            cell_accuracy=t.cell_accuracy,
            error=r.error,
            prompt_tokens=prompt_tokens,
            prompt_limit=prompt_limit,
            aligned=_aligned_out(t.aligned),
            debug=debug,
        )


class _Response(BaseModel):
    count: int
    failed: int = Field(0, description="Items whose error is an infrastructure failure (executor_failed).")
    prompt_version: str
    elapsed_ms: float


class SchemaResponse(_Response):
    results: list[SchemaResult]


class TableResponse(_Response):
    results: list[TableResult]


class PipelineResponse(_Response):
    results: list[PipelineResult]
    executor_calls: int = Field(0, description="Executor calls this request made (after de-duplication and cache).")
    prompt_too_long: int = Field(
        0,
        description="Items whose Stage-2 prompt does not fit the executor's context (error='prompt_too_long'): "
        "bad input, not an infrastructure failure, so not counted in 'failed'.",
    )
    executor_truncated: int = Field(
        0,
        description="Items whose executor answer was cut at its token limit (error='executor_truncated'): "
        "a configuration fault (raise MAX_TOKENS), not the policy's mistake.",
    )


class ErrorBody(BaseModel):
    """Every non-2xx answer: a machine-readable cause plus a human message naming the field."""

    error: str
    detail: Any = None

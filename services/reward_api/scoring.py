"""Local rewards (schema, table): ``shared.compute_*`` applied to a batch, off the event loop.

Scoring is CPU-bound pure Python, so each batch runs in a worker thread (``anyio.to_thread``): the event
loop keeps answering health checks and other requests meanwhile. For CPU parallelism run several
worker processes (``--workers N``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import anyio.to_thread

from services.reward_api import metrics
from shared import DEFAULT_MAX_ALIGN_ROWS, compute_schema_reward_single, compute_table_reward_single
from shared.rewards import SchemaReward, SchemaRewardConfig, TableReward, TableRewardConfig

T = TypeVar("T")


async def off_loop(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a worker thread."""
    return await anyio.to_thread.run_sync(fn)


class HasNames(Protocol):
    def names(self) -> list[str]: ...


class TableLike(HasNames, Protocol):
    @property
    def data(self) -> list[list[str | None]]: ...


class SchemaItemLike(Protocol):
    """A schema item: ``shared.wire.SchemaItem`` or the hot path's ``body.FastSchemaItem``."""

    @property
    def id(self) -> str: ...
    @property
    def prediction(self) -> str: ...
    @property
    def gold_schema(self) -> HasNames: ...


class TableItemLike(Protocol):
    """A table item: ``shared.wire.TableItem`` or the hot path's ``body.FastTableItem``."""

    @property
    def id(self) -> str: ...
    @property
    def prediction(self) -> str: ...
    @property
    def gold_table(self) -> TableLike: ...


def table_view(table: TableLike) -> dict[str, Any]:
    """The two fields the table reward reads, without copying the item (``model_dump`` per item was
    a fifth of the request time at batch 1024)."""
    return {"columns": table.names(), "data": table.data}


def score_schema_batch(items: Sequence[SchemaItemLike], config: SchemaRewardConfig) -> list[tuple[str, SchemaReward]]:
    return [(it.id, compute_schema_reward_single(it.prediction, it.gold_schema.names(), config)) for it in items]


def score_table_batch(
    items: Sequence[TableItemLike], config: TableRewardConfig, max_align_rows: int = DEFAULT_MAX_ALIGN_ROWS
) -> list[tuple[str, TableReward]]:
    """``max_align_rows``: the server's cap on the rows the table alignment sees (REWARD_API_MAX_ALIGN_ROWS)."""
    return [
        (it.id, compute_table_reward_single(it.prediction, table_view(it.gold_table), config, max_align_rows))
        for it in items
    ]


def observe(endpoint: str, results: Sequence[SchemaReward | TableReward]) -> None:
    """Per-item metrics: items, invalid predictions, reward distribution."""
    observe_rewards(endpoint, [r.reward for r in results], sum(1 for r in results if not r.valid_json))


def observe_rewards(endpoint: str, rewards: Sequence[float], invalid: int) -> None:
    """``observe`` from the rewards and the number of invalid predictions."""
    metrics.ITEMS.labels(endpoint).inc(len(rewards))
    if invalid:
        metrics.INVALID_JSON.labels(endpoint).inc(invalid)
    hist = metrics.REWARD.labels(endpoint)
    for r in rewards:
        hist.observe(r)

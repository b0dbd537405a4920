"""The pipeline reward: schema reward, then the frozen π2 executor on the predicted schema, then the table reward.

For each item: the Stage 1 → Stage 2 hand-off (``shared.stage2_handoff``, the one evaluation uses) parses
the predicted schema once and gives the Stage-2 prompt (the document and the *predicted* schema, with the
template's neutral ``schema_id``) or the reason there is none; that parsed schema is scored (``shared``). An
item without a prompt (invalid schema) takes ``shared.pipeline_reward_for_invalid_schema`` and costs no
executor call. Identical prompts are sent once; the executor's text is scored with
``shared.compute_table_reward_single`` and combined with ``shared.combine_pipeline_reward``. Failures
follow ``failures``' policy; a prompt that does not fit the executor's context is the item's own outcome,
``prompt_too_long`` (``failures``, point 6), and so is an answer cut at the executor's token limit,
``executor_truncated`` (``failures``, point 7). In ``fail`` mode the first failed call ends the executor
phase: the calls still running for this request are cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec
from fastapi import Response

from services.reward_api import metrics
from services.reward_api.errors import ExecutorPhaseError
from services.reward_api.executor_client import Completion, ExecutorClient, Message
from services.reward_api.failures import ExecutorFailure, PromptTooLong
from services.reward_api.scoring import HasNames, TableLike, observe_rewards, off_loop, table_view
from services.reward_api.settings import Settings
from shared import (
    DEFAULT_MAX_ALIGN_ROWS,
    EXECUTOR_TRUNCATED,
    combine_pipeline_reward,
    compute_schema_reward_parsed,
    compute_table_reward_single,
    pipeline_reward_for_executor_failure,
    pipeline_reward_for_executor_truncated,
    pipeline_reward_for_invalid_schema,
    pipeline_reward_for_prompt_too_long,
    stage2_handoff,
)
from shared.prompts import PromptTemplate
from shared.rewards import PipelineReward, PipelineSchemaRewardConfig, SchemaReward
from shared.wire import PipelineDebug, PipelineResult

log = logging.getLogger("reward_api.pipeline")
_ENCODER = msgspec.json.Encoder()

Outcome = Completion | ExecutorFailure | PromptTooLong


class PipelineItemLike(Protocol):
    """A pipeline item: ``shared.wire.PipelineItem`` or the hot path's ``body.FastPipelineItem``."""

    @property
    def id(self) -> str: ...
    @property
    def prediction(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def gold_schema(self) -> HasNames: ...
    @property
    def gold_table(self) -> TableLike: ...


class PipelineRequestLike(Protocol):
    """``shared.wire.PipelineRequest`` or ``body.FastPipelineRequest`` (the config comes validated beside it)."""

    @property
    def items(self) -> Sequence[PipelineItemLike]: ...
    @property
    def debug(self) -> bool: ...
    @property
    def on_executor_error(self) -> Literal["fail", "penalize"]: ...


@dataclass(frozen=True)
class _Prepared:
    schema: SchemaReward
    messages: list[Message] | None  # None: no Stage-2 prompt (invalid schema), no executor call
    key: str | None


def _prepare(
    items: Sequence[PipelineItemLike],
    cfg: PipelineSchemaRewardConfig,
    template: PromptTemplate,
    client: ExecutorClient | None,
) -> list[_Prepared]:
    out = []
    for it in items:
        handoff = stage2_handoff(it.text, it.prediction, template)
        schema = compute_schema_reward_parsed(handoff.schema, it.gold_schema.names(), cfg.schema_reward)
        messages = handoff.messages
        if messages is None:
            out.append(_Prepared(schema, None, None))
            continue
        # Without a client the key only has to group identical prompts; the call then fails as not_configured.
        key = client.key(messages) if client else json.dumps(messages, sort_keys=True)
        out.append(_Prepared(schema, messages, key))
    return out


def _finish(
    items: Sequence[PipelineItemLike],
    prepared: Sequence[_Prepared],
    outputs: dict[str, Outcome],
    cfg: PipelineSchemaRewardConfig,
    debug: bool,
    first_use: set[int],
    max_align_rows: int = DEFAULT_MAX_ALIGN_ROWS,
) -> tuple[list[dict[str, Any]], list[PipelineReward]]:
    """The result rows (``PipelineResult.row``) and the rewards behind them."""
    results, rewards = [], []
    for i, (it, p) in enumerate(zip(items, prepared, strict=True)):
        gold_table = table_view(it.gold_table)
        view: dict[str, Any] | None = PipelineDebug.row() if debug else None
        tokens = limit = None
        if p.key is None:
            reward = pipeline_reward_for_invalid_schema(p.schema, gold_table, cfg)
        else:
            out = outputs[p.key]
            if isinstance(out, PromptTooLong):
                reward = pipeline_reward_for_prompt_too_long(p.schema, gold_table, cfg)
                tokens, limit = out.tokens, out.limit
                if view:
                    view = PipelineDebug.row(messages=p.messages)
            elif isinstance(out, ExecutorFailure):
                reward = pipeline_reward_for_executor_failure(p.schema, gold_table, cfg)
                if view:
                    view = PipelineDebug.row(messages=p.messages)
            else:
                if out.truncated:
                    reward = pipeline_reward_for_executor_truncated(p.schema, gold_table, cfg)
                else:
                    table = compute_table_reward_single(out.text, gold_table, cfg.table_reward, max_align_rows)
                    reward = combine_pipeline_reward(p.schema, table, cfg)
                if view:
                    # cached: this item did not cause its own call (LRU hit, a joined or an earlier identical one).
                    cached = not (out.source == "call" and i in first_use)
                    view = PipelineDebug.row(messages=p.messages, executor_output=out.text, cached=cached)
        results.append(PipelineResult.row(it.id, reward, view, prompt_tokens=tokens, prompt_limit=limit))
        rewards.append(reward)
    return results, rewards


class PipelineScorer:
    """Scores pipeline requests; holds the executor client (``None`` when no executor is configured)."""

    def __init__(
        self, settings: Settings, client: ExecutorClient | None, template: PromptTemplate, prompt_version: str
    ):
        self.settings = settings
        self.client = client
        self.template = template
        self.prompt_version = prompt_version

    async def score(self, req: PipelineRequestLike, cfg: PipelineSchemaRewardConfig) -> Response:
        """The ``PipelineResponse``, encoded once by msgspec from plain dicts (``PipelineResult.row``):
        a pydantic model per result, re-validated by FastAPI's ``response_model``, cost more than scoring."""
        t0 = time.perf_counter()
        if self.client is not None:
            await self.client.refresh_model()  # the model's identity is part of every key built below
        prepared = await off_loop(lambda: _prepare(req.items, cfg, self.template, self.client))
        needed: dict[str, list[Message]] = {}
        first_use: set[int] = set()
        for i, p in enumerate(prepared):
            if p.key is not None and p.messages is not None and p.key not in needed:
                needed[p.key] = p.messages
                first_use.add(i)
        outputs = await self._generate(needed, fail_fast=req.on_executor_error == "fail")
        failures = {k: v for k, v in outputs.items() if isinstance(v, ExecutorFailure)}
        failed_items = sum(1 for p in prepared if p.key in failures)
        if failures:
            # The cause that failed the request, not one of the calls stopped because of it.
            first = next((f for f in failures.values() if f.cause != "cancelled"), next(iter(failures.values())))
            # A missing executor is a deployment error, never a per-item penalty.
            if req.on_executor_error == "fail" or first.cause == "not_configured":
                raise ExecutorPhaseError(first, failed_items, len(prepared))
        results, rewards = await off_loop(
            lambda: _finish(req.items, prepared, outputs, cfg, req.debug, first_use, self.settings.max_align_rows)
        )
        observe_rewards("/reward/pipeline", [r.reward for r in rewards], sum(not r.schema.valid_json for r in rewards))
        calls = sum(1 for v in outputs.values() if isinstance(v, Completion) and v.source == "call")
        calls += sum(1 for v in failures.values() if v.cause not in ("deadline", "not_configured", "cancelled"))
        too_long = sum(1 for p in prepared if p.key is not None and isinstance(outputs.get(p.key), PromptTooLong))
        if too_long:
            metrics.FAILURES.labels("prompt_too_long").inc(too_long)
        truncated = sum(1 for r in rewards if r.error == EXECUTOR_TRUNCATED)
        if truncated:
            metrics.FAILURES.labels(EXECUTOR_TRUNCATED).inc(truncated)
            log.warning(
                "%d of %d item(s) cut at the executor's token limit (MAX_TOKENS=%d): raise REWARD_API_MAX_TOKENS",
                truncated, len(rewards), self.settings.max_tokens,
            )  # fmt: skip
        body = {
            "count": len(results), "failed": failed_items, "prompt_version": self.prompt_version,
            "elapsed_ms": round((time.perf_counter() - t0) * 1000, 3), "results": results,
            "executor_calls": calls, "prompt_too_long": too_long, "executor_truncated": truncated,
        }  # fmt: skip
        return Response(_ENCODER.encode(body), media_type="application/json")

    async def _generate(self, needed: dict[str, list[Message]], fail_fast: bool = False) -> dict[str, Outcome]:
        """One executor call per distinct prompt, all concurrent, bounded by ``REQUEST_DEADLINE_S``. With
        ``fail_fast`` (``fail`` mode: one failure fails the request) the first failure stops the rest."""
        if not needed:
            return {}
        client = self.client
        if client is None:
            failure = ExecutorFailure("not_configured", "no executor configured (set REWARD_API_EXECUTOR_URLS)")
            return dict.fromkeys(needed, failure)
        tasks = {key: asyncio.ensure_future(client.complete(msgs, key)) for key, msgs in needed.items()}
        deadline = time.monotonic() + self.settings.request_deadline_s
        pending: set[asyncio.Future[Completion]] = set(tasks.values())
        stopped = False
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if fail_fast and any(not t.cancelled() and isinstance(t.exception(), ExecutorFailure) for t in done):
                    stopped = True
                    break
        finally:
            # This request's waits; the client cancels a shared call once no request awaits it.
            for task in pending:
                task.cancel()
        out: dict[str, Outcome] = {}
        for key, task in tasks.items():
            if task in pending and stopped:
                out[key] = ExecutorFailure("cancelled", "not awaited: another call of this request failed")
                continue
            if task in pending:
                out[key] = ExecutorFailure(
                    "deadline", f"no executor answer within REQUEST_DEADLINE_S={self.settings.request_deadline_s} s"
                )
                continue
            exc = task.exception()
            if exc is None:
                out[key] = task.result()
            elif isinstance(exc, ExecutorFailure | PromptTooLong):
                out[key] = exc
            else:
                raise exc
        for failure in {id(f): f for f in out.values() if isinstance(f, ExecutorFailure)}.values():
            metrics.FAILURES.labels(f"executor_{failure.cause}").inc()
        return out

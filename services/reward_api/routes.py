"""Thin HTTP routes: read the body (``body``), check limits, score (``scoring`` / ``pipeline``), answer wire types."""

from __future__ import annotations

import asyncio
import contextlib
import platform
import time
from collections.abc import Coroutine, Sequence
from importlib import metadata
from typing import Any

import msgspec
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from services.reward_api import metrics
from services.reward_api.body import FastPipelineRequest, FastSchemaRequest, FastTableRequest, read_fast
from services.reward_api.limits import check_auth, check_items
from services.reward_api.pipeline import PipelineScorer
from services.reward_api.scoring import observe, off_loop, score_schema_batch, score_table_batch
from services.reward_api.settings import Settings
from shared import __version__ as shared_version
from shared.rewards import (
    PipelineSchemaRewardConfig,
    SchemaReward,
    SchemaRewardConfig,
    TableReward,
    TableRewardConfig,
)
from shared.wire import (
    ErrorBody,
    PipelineRequest,
    PipelineResponse,
    SchemaRequest,
    SchemaResponse,
    SchemaResult,
    TableRequest,
    TableResponse,
    TableResult,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 408, 413, 415, 422, 429, 500, 503)
}

reward_router = APIRouter(prefix="/reward", dependencies=[Depends(check_auth)], responses=_ERRORS)
ops_router = APIRouter()


def _settings(request: Request) -> Settings:
    s: Settings = request.app.state.settings
    return s


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a route that reads its body itself (``body``): the pydantic model
    stays the documented contract; ``app.py`` adds the models to the components."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


# The request limits /info reports (each a setting; docs/reliability.md gives its default and its answer).
LIMITS = (
    "max_items", "max_text_chars", "max_body_bytes", "max_rows_per_item", "max_cells_per_item",
    "max_cells_per_request", "max_columns", "max_column_name_chars", "max_id_chars", "max_align_rows",
    "max_concurrent_requests", "max_connections", "header_timeout_s", "body_timeout_s", "queue_timeout_s",
    "max_in_flight", "max_in_flight_per_executor",
)  # fmt: skip

REQUEST_MODELS: tuple[type[BaseModel], ...] = (SchemaRequest, TableRequest, PipelineRequest)


def _encoded(
    results: list[dict[str, Any]], prompt_version: str, t0: float, then: BackgroundTask | None = None
) -> Response:
    """The response (the route's ``response_model``, field for field) encoded once by msgspec from plain
    dicts: building and re-validating a pydantic model per result cost more than the scoring. ``then`` runs
    once the answer is sent."""
    body = {
        "count": len(results), "failed": 0, "prompt_version": prompt_version, "elapsed_ms": _elapsed_ms(t0),
        "results": results,
    }  # fmt: skip
    return Response(_ENCODER.encode(body), media_type="application/json", background=then)


def _observe_after_answer(endpoint: str, scored: Sequence[tuple[str, SchemaReward | TableReward]]) -> BackgroundTask:
    """Per-item metrics once the answer is sent: 1,024 histogram observations added ~3 ms to a batch's
    latency, now spent while the caller decodes the answer. The task is async and never awaits, so Starlette
    runs it in the request's own task right after the last body chunk, without letting the event loop turn
    to another request first: a ``/metrics`` read after the answer sees these items (tests/services/reward_api
    /test_routes.py reads them so)."""

    async def record() -> None:
        observe(endpoint, [r for _, r in scored])

    return BackgroundTask(record)


_ENCODER = msgspec.json.Encoder()


def _elapsed_ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


@reward_router.post("/schema", response_model=SchemaResponse, openapi_extra=request_body(SchemaRequest))
async def reward_schema(request: Request) -> Response:
    t0 = time.perf_counter()
    body, cfg = await read_fast(request, FastSchemaRequest, SchemaRequest, SchemaRewardConfig)
    check_items(body.items, _settings(request), ("prediction",))
    scored = await off_loop(lambda: score_schema_batch(body.items, cfg))
    results = [SchemaResult.row(i, r) for i, r in scored]
    return _encoded(results, request.app.state.prompt_version, t0, _observe_after_answer("/reward/schema", scored))


@reward_router.post("/table", response_model=TableResponse, openapi_extra=request_body(TableRequest))
async def reward_table(request: Request) -> Response:
    t0 = time.perf_counter()
    body, cfg = await read_fast(request, FastTableRequest, TableRequest, TableRewardConfig)
    settings = _settings(request)
    check_items(body.items, settings, ("prediction",))
    scored = await off_loop(lambda: score_table_batch(body.items, cfg, settings.max_align_rows))
    results = [TableResult.row(i, r) for i, r in scored]
    return _encoded(results, request.app.state.prompt_version, t0, _observe_after_answer("/reward/table", scored))


@reward_router.post(
    "/pipeline",
    response_model=PipelineResponse,
    response_model_exclude_none=False,
    openapi_extra=request_body(PipelineRequest),
)
async def reward_pipeline(request: Request) -> Response:
    body, cfg = await read_fast(request, FastPipelineRequest, PipelineRequest, PipelineSchemaRewardConfig)
    check_items(body.items, _settings(request), ("prediction", "text"))
    scorer: PipelineScorer = request.app.state.pipeline
    return await unless_client_leaves(request, scorer.score(body, cfg))


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, Response]) -> Response:
    """``work``'s answer, or, if the client disconnects first, ``work`` cancelled (its executor calls that no
    other request awaits are cancelled with it) and ``ClientDisconnect`` raised (counted as an abort)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.done():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnect()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read, so the only message left is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@ops_router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up and its event loop answers."""
    return {"status": "ok"}


@ops_router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Local readiness (the Service's probe): this process is up and scores schema and table rewards, which
    need no executor. It never waits on an executor: a down executor must not take the replicas that
    serve B1/B2 (which never use it) out of the Service. Pipeline readiness is ``/readyz/pipeline``."""
    scorer: PipelineScorer = request.app.state.pipeline
    configured = "see /readyz/pipeline" if scorer.client is not None else "executor not configured"
    return JSONResponse({"status": "ready", "pipeline": configured})


@ops_router.get("/readyz/pipeline")
async def readyz_pipeline(request: Request) -> JSONResponse:
    """Ready to score pipeline rewards. With executors configured: 200 only if at least one replica answers
    ``/v1/models`` (within ``READY_TIMEOUT_S``), lists ``EXECUTOR_MODEL`` and generates (a call within
    ``READY_GENERATION_FRESH_S``, else one token within ``READY_TIMEOUT_S``) (else 503). Without: 200,
    ``pipeline: "executor not configured"`` (/reward/pipeline answers 503 executor_not_configured)."""
    scorer: PipelineScorer = request.app.state.pipeline
    if scorer.client is None:
        return JSONResponse({"status": "ready", "pipeline": "executor not configured", "replicas": []})
    replicas = await scorer.client.ready()
    ok = any(r["ready"] for r in replicas)
    body = {
        "status": "ready" if ok else "not_ready",
        "pipeline": "ready" if ok else "executor unavailable",
        "replicas": replicas,
    }
    return JSONResponse(body, status_code=200 if ok else 503)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@ops_router.get("/info", dependencies=[Depends(check_auth)])
async def info(request: Request) -> dict[str, Any]:
    """Versions, prompt version, reward defaults and the executor setup (never URLs or secrets)."""
    s = _settings(request)
    scorer: PipelineScorer = request.app.state.pipeline
    return {
        "service": "reward_api",
        "versions": {
            "shared": shared_version,
            "python": platform.python_version(),
            **{d: _version(d) for d in ("fastapi", "pydantic", "httpx", "uvicorn", "prometheus-client")},
        },
        "prompt_version": request.app.state.prompt_version,
        "stage2_template_version": scorer.template.version,
        "reward_defaults": {
            "schema": SchemaRewardConfig().model_dump(),
            "table": TableRewardConfig().model_dump(),
            "pipeline": PipelineSchemaRewardConfig().model_dump(),
        },
        "executor": {
            "configured": s.pipeline_enabled,
            "model": s.executor_model,
            "replicas": len(s.executor_urls),
            "sampling": scorer.client.sampling_params() if scorer.client else None,
            "timeout_s": s.executor_timeout_s,
            "request_deadline_s": s.request_deadline_s,
            "retries": s.retries,
            "max_in_flight": s.max_in_flight,
            "max_in_flight_per_executor": s.max_in_flight_per_executor,
            "max_tokens": s.max_tokens,
            "cache_size": s.cache_size,
        },
        "limits": {name: getattr(s, name) for name in LIMITS},
        "auth": s.token is not None,
    }


@ops_router.get("/metrics")
async def prometheus_metrics() -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)

"""The reward API application: ``create_app(settings)``; ``app`` is what uvicorn imports
(``services.reward_api.app:app``), built from the ``REWARD_API_*`` environment."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from services.reward_api.errors import install_handlers
from services.reward_api.executor_client import ExecutorClient
from services.reward_api.limits import AdmissionMiddleware, BodyLimitMiddleware
from services.reward_api.logs import configure_logging
from services.reward_api.middleware import RequestContextMiddleware
from services.reward_api.pipeline import PipelineScorer
from services.reward_api.routes import REQUEST_MODELS, ops_router, reward_router
from services.reward_api.settings import Settings
from shared import __version__, prompt_version, stage2_template

log = logging.getLogger("reward_api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)
    # Loaded now, so a bad STAGE2_TEMPLATE stops the start-up instead of failing every request.
    template = stage2_template(settings.stage2_template)
    version = prompt_version(stage2=settings.stage2_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = ExecutorClient(settings) if settings.pipeline_enabled else None
        app.state.pipeline = PipelineScorer(settings, client, template, version)
        log.info(
            "reward_api up: prompt %s, executor model %r on %d replica(s)",
            version,
            settings.executor_model,
            len(settings.executor_urls),
        )
        freeze_startup_heap()
        try:
            yield
        finally:
            gc.unfreeze()
            if client is not None:
                await client.aclose()
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    app = FastAPI(
        title="reward_api",
        version=__version__,
        summary="Batched schema / table / pipeline rewards (docs/reward_api.md#contract).",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.prompt_version = version
    install_handlers(app)
    _document_request_models(app)
    app.include_router(reward_router)
    app.include_router(ops_router)
    # Added last = outermost: the request id and the catch-all wrap everything, including the body limit.
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s
    )
    app.add_middleware(AdmissionMiddleware, settings=settings)  # outside the body limit: its clock starts with a slot
    app.add_middleware(RequestContextMiddleware)
    return app


def freeze_startup_heap() -> None:
    """Move the objects alive after start-up (modules, the app, pydantic's validators: ~200k) out of the
    cyclic GC's reach (``gc.freeze``). A batch-1024 request decodes ~20k objects that live until it is
    answered; they regularly set off a full collection that walked the whole start-up heap, which made
    decoding the body twice as slow on average (3.3 -> 7.4 ms per request). ``gc.collect`` first, so no
    garbage is frozen; the lifespan unfreezes at shutdown (tests run several apps in one process)."""
    gc.collect()
    gc.freeze()


def _document_request_models(app: FastAPI) -> None:
    """The /reward/* routes read their bodies themselves (``body``), so FastAPI does not see the request
    models; their JSON schemas join the OpenAPI components that the routes' ``requestBody`` refers to."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _, defs = models_json_schema(
                [(m, "validation") for m in REQUEST_MODELS], ref_template="#/components/schemas/{model}"
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault(name, definition)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


app = create_app()

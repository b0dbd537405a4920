"""Errors → HTTP status codes, in one place. Every non-2xx body is ``shared.wire.ErrorBody``.

| error | status |
|---|---|
| ``invalid_request`` (unknown key, wrong type, text too long; ``detail`` names each field) | 422 |
| ``unauthorized`` (``TOKEN`` set, no/wrong ``Authorization: Bearer``) | 401 |
| ``too_many_items`` (more than ``MAX_ITEMS``), ``body_too_large`` (more than ``MAX_BODY_BYTES``) | 413 |
| ``item_too_large`` (rows, cells or columns of one item), ``too_many_cells`` (cells of one request) | 413 |
| ``body_timeout`` (body not in within ``BODY_TIMEOUT_S``) | 408 |
| ``unsupported_media_type`` (a ``/reward/*`` body not declared ``application/json``) | 415 |
| ``too_many_requests`` (no slot of ``MAX_CONCURRENT_REQUESTS`` within ``QUEUE_TIMEOUT_S``) | 429 |
| ``executor_unavailable`` / ``executor_bad_response`` / ``executor_not_configured`` | 503 |
| ``internal`` (anything unexpected; no stack trace, ``detail.request_id`` for the logs) | 500 |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.reward_api import metrics
from services.reward_api.failures import ExecutorFailure
from shared.wire import ErrorBody

log = logging.getLogger("reward_api")


class ApiError(Exception):
    """A typed error the routes raise; the handler below turns it into its status and body."""

    def __init__(self, status: int, error: str, detail: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


class ExecutorPhaseError(ApiError):
    """Executor calls of a pipeline request failed and the request asked for ``on_executor_error='fail'``."""

    def __init__(self, failure: ExecutorFailure, failed_items: int, total_items: int) -> None:
        error = "executor_not_configured" if failure.cause == "not_configured" else failure.error_code
        detail = {
            "cause": failure.cause,
            "message": failure.message,
            "attempts": failure.attempts,
            "failed_items": failed_items,
            "items": total_items,
        }
        super().__init__(503, error, detail, headers={"Retry-After": "5"})
        self.failure = failure


def field_path(loc: Sequence[int | str]) -> str:
    """``("body", "items", 3, "text")`` → ``items[3].text``; ``("body",)`` → ``body``."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def error_response(
    status: int, error: str, detail: Any = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    metrics.FAILURES.labels(error).inc()
    body = ErrorBody(error=error, detail=detail).model_dump()
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


_HTTP_ERRORS = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "body_too_large",
}


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s: %s", exc.error, exc.detail)
        return error_response(exc.status, exc.error, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # The input itself is not echoed back: it can be megabytes of text.
        detail = []
        for e in exc.errors():
            loc, msg = e.get("loc", ()), e.get("msg", "")
            if e.get("type") == "json_invalid":  # loc is ("body", character offset)
                loc, msg = ("body",), f"{msg} at character {loc[-1]}: {e.get('ctx', {}).get('error', '')}"
            detail.append({"field": field_path(loc), "message": msg, "type": e.get("type", "")})
        return error_response(422, "invalid_request", detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _HTTP_ERRORS.get(exc.status_code, "http_error"), exc.detail, exc.headers)


def internal_error_response(request_id: str) -> JSONResponse:
    """The catch-all answer: no stack trace leaves the process, only an id to find it in the logs."""
    return error_response(500, "internal", {"request_id": request_id})

"""Request limits and authentication, each a setting with its own answer (docs/reliability.md lists them):

- ``AdmissionMiddleware`` (``/reward/*``): a content type other than JSON → 415; more than
  ``MAX_CONCURRENT_REQUESTS`` requests at once (a slot not free within ``QUEUE_TIMEOUT_S``) → 429;
- ``BodyLimitMiddleware``: a body over ``MAX_BODY_BYTES`` → 413; a body not in within ``BODY_TIMEOUT_S`` → 408;
- ``check_items``: items, ids, columns, rows and cells per item and per request → 413 / 422 naming the field;
- ``check_auth``: bearer token → 401.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.reward_api import metrics
from services.reward_api.errors import ApiError, error_response
from services.reward_api.settings import Settings


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class AdmissionMiddleware:
    """For ``POST /reward/*``: 415 unless the body is declared JSON (``text/plain``, form and multipart bodies
    are what a web page may send to a loopback service without a CORS preflight), then at most
    ``MAX_CONCURRENT_REQUESTS`` requests past this point at once (pipeline requests and local ones each),
    body reading included, so decoded bodies
    and scoring threads are bounded per process; a request that finds no slot within ``QUEUE_TIMEOUT_S``
    is a 429 with ``Retry-After``. The token is checked before a slot is taken."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.max = settings.max_concurrent_requests
        self.wait_s = settings.queue_timeout_s
        # Made inside the event loop; pipeline requests (which mostly wait on the executor) have their own
        # slots, so a slow executor never starves the local schema/table requests of the same worker.
        self._slots: dict[bool, asyncio.Semaphore] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/reward/") or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        content_type = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"content-type"), "")
        if not _is_json(content_type):
            detail = {"field": "content-type", "message": f"expected application/json, got {content_type[:100]!r}"}
            await error_response(415, "unsupported_media_type", detail)(scope, receive, send)
            return
        if not authorized(self.settings, scope):  # before a slot: an unauthenticated client holds none
            await _unauthorized()(scope, receive, send)
            return
        slots = self._slots.get(scope["path"] == "/reward/pipeline")
        if slots is None:
            slots = self._slots[scope["path"] == "/reward/pipeline"] = asyncio.Semaphore(self.max)
        try:
            async with asyncio.timeout(self.wait_s):
                await slots.acquire()
        except TimeoutError:
            busy = {"limit": self.max, "message": f"more than {self.max} requests at once in this process"}
            await error_response(429, "too_many_requests", busy, {"Retry-After": "1"})(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            slots.release()


class BodyLimitMiddleware:
    """413 for a body over ``MAX_BODY_BYTES``: from ``Content-Length`` first, then counted while it streams
    (a chunked or lying client cannot get past it). 408 for a body that has not fully arrived within
    ``BODY_TIMEOUT_S`` of the request's start (a slow-body client cannot hold a slot)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = error_response(413, "body_too_large", {"limit_bytes": limit, "content_length": int(value)})
                await response(scope, receive, send)
                return
        seen = 0
        complete = False
        deadline = time.monotonic() + self.body_timeout_s

        async def counted() -> Message:
            nonlocal seen, complete
            if complete:  # after the body: only the disconnect notice, awaited as long as the answer takes
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                metrics.TIMEOUTS.labels("body").inc()
                raise HTTPException(408, f"request body not received within {self.body_timeout_s} s") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > limit:
                    # Raised inside the route's body read; FastAPI re-raises HTTPException → the 413 handler.
                    raise HTTPException(413, f"body over the limit of {limit} bytes (received {seen} so far)")
            return message

        await self.app(scope, counted, send)


_UNAUTHORIZED = "missing or wrong 'Authorization: Bearer <token>'"


def authorized(settings: Settings, scope: Scope) -> bool:
    """With ``TOKEN`` set, whether the request carries ``Authorization: Bearer <TOKEN>``."""
    if settings.token is None:
        return True
    header = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"authorization"), "")
    scheme, _, given = header.partition(" ")
    expected = settings.token.get_secret_value()
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


def _unauthorized() -> Any:
    return error_response(401, "unauthorized", _UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})


def check_auth(request: Request) -> None:
    """FastAPI dependency: with ``TOKEN`` set, require ``Authorization: Bearer <TOKEN>``."""
    if not authorized(request.app.state.settings, request.scope):
        raise ApiError(401, "unauthorized", _UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})


def _too_long(field: str, n: int, limit: int) -> dict[str, Any]:
    return {"field": field, "message": f"{n} characters; the limit is {limit}", "type": "too_long"}


def _too_many(field: str, what: str, n: int, limit: int) -> dict[str, Any]:
    return {
        "field": field,
        "message": f"{n} {what}; the limit is {limit}",
        "type": "too_many",
        "limit": limit,
        "got": n,
    }


def check_items(items: Sequence[Any], settings: Settings, text_fields: Sequence[str]) -> None:
    """What reaches scoring is bounded before any scoring starts:

    - 413 ``too_many_items`` for more than ``MAX_ITEMS`` items;
    - 413 ``item_too_large`` naming ``items[i].gold_table.data`` / ``.columns`` for a gold table of more than
      ``MAX_ROWS_PER_ITEM`` rows, ``MAX_CELLS_PER_ITEM`` cells or ``MAX_COLUMNS`` columns;
    - 413 ``too_many_cells`` for more than ``MAX_CELLS_PER_REQUEST`` gold cells in the whole request;
    - 422 ``invalid_request`` naming ``items[i].field`` for a text over ``MAX_TEXT_CHARS``, an ``id`` over
      ``MAX_ID_CHARS`` or a gold column name over ``MAX_COLUMN_NAME_CHARS``."""
    s = settings
    if len(items) > s.max_items:
        raise ApiError(413, "too_many_items", {"field": "items", "limit": s.max_items, "got": len(items)})
    errors: list[dict[str, Any]] = []
    large: list[dict[str, Any]] = []
    cells = 0
    max_text, max_id, max_cols, max_name = s.max_text_chars, s.max_id_chars, s.max_columns, s.max_column_name_chars
    max_rows, max_item_cells = s.max_rows_per_item, s.max_cells_per_item
    golds = [g for g in ("gold_schema", "gold_table") if items and hasattr(items[0], g)]
    # One tight pass: it runs before every batch (1,024 schema items: ~0.5 ms, against ~15 ms of scoring).
    for i, item in enumerate(items):
        for name in text_fields:
            n = len(getattr(item, name))
            if n > max_text:
                errors.append(_too_long(f"items[{i}].{name}", n, max_text))
        if len(item.id) > max_id:
            errors.append(_too_long(f"items[{i}].id", len(item.id), max_id))
        for gold in golds:
            columns = getattr(item, gold).columns
            if len(columns) > max_cols:
                large.append(_too_many(f"items[{i}].{gold}.columns", "columns", len(columns), max_cols))
            elif columns and max(len(c.name) for c in columns) > max_name:
                for k, col in enumerate(columns):
                    if len(col.name) > max_name:
                        errors.append(_too_long(f"items[{i}].{gold}.columns[{k}].name", len(col.name), max_name))
        if "gold_table" in golds:
            table = item.gold_table
            rows = len(table.data)
            n_cells = rows * len(table.columns)
            cells += n_cells
            if rows > max_rows:
                large.append(_too_many(f"items[{i}].gold_table.data", "rows", rows, max_rows))
            elif n_cells > max_item_cells:
                large.append(_too_many(f"items[{i}].gold_table.data", "cells", n_cells, max_item_cells))
    if large:
        raise ApiError(413, "item_too_large", large)
    if cells > s.max_cells_per_request:
        raise ApiError(413, "too_many_cells", {"field": "items", "limit": s.max_cells_per_request, "got": cells})
    if errors:
        raise ApiError(422, "invalid_request", errors)

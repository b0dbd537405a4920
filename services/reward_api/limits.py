"""Request limits and authentication: body size (413), item count (413), text length (422), bearer token (401)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.reward_api.errors import ApiError, error_response
from services.reward_api.settings import Settings


class BodyLimitMiddleware:
    """413 for a body over ``MAX_BODY_BYTES``: from ``Content-Length`` first, then counted while it streams
    (a chunked or lying client cannot get past it)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max = max_body_bytes

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

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # Raised inside the route's body read; FastAPI re-raises HTTPException → the 413 handler.
                    raise HTTPException(413, f"body over the limit of {limit} bytes (received {seen} so far)")
            return message

        await self.app(scope, counted, send)


def check_auth(request: Request) -> None:
    """FastAPI dependency: with ``TOKEN`` set, require ``Authorization: Bearer <TOKEN>``."""
    settings: Settings = request.app.state.settings
    if settings.token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = settings.token.get_secret_value()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise ApiError(
            401, "unauthorized", "missing or wrong 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"}
        )


def check_items(items: Sequence[Any], settings: Settings, text_fields: Sequence[str]) -> None:
    """413 for too many items; 422 naming ``items[i].field`` for a text over ``MAX_TEXT_CHARS``."""
    if len(items) > settings.max_items:
        raise ApiError(413, "too_many_items", {"field": "items", "limit": settings.max_items, "got": len(items)})
    limit = settings.max_text_chars
    errors = []
    for i, item in enumerate(items):
        for name in text_fields:
            n = len(getattr(item, name))
            if n > limit:
                errors.append(
                    {
                        "field": f"items[{i}].{name}",
                        "message": f"{n} characters; the limit is {limit}",
                        "type": "too_long",
                    }
                )
    if errors:
        raise ApiError(422, "invalid_request", errors)

"""Per-request context: X-Request-ID in/out, one JSON access-log line, request metrics, the catch-all 500."""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.reward_api import metrics
from services.reward_api.errors import internal_error_response
from services.reward_api.logs import request_id_var

log = logging.getLogger("reward_api.access")

# Endpoint label values are fixed so a scanner's random paths cannot blow up the metrics' cardinality.
ENDPOINTS = frozenset(
    {
        "/reward/schema",
        "/reward/table",
        "/reward/pipeline",
        "/healthz",
        "/readyz",
        "/readyz/pipeline",
        "/info",
        "/metrics",
    }
)
CLIENT_ABORT = 499  # status label of a request whose client left before the answer (nginx's convention)
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-request-id"), "")
        rid = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        request_id_var.set(rid)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = 500
        started = False
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client went away mid-body: nobody to answer, and not a server error.
            status = CLIENT_ABORT
            metrics.CLIENT_ABORTS.labels(endpoint).inc()
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if not started:
                await internal_error_response(rid)(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - t0
            metrics.REQUESTS.labels(endpoint, str(status)).inc()
            metrics.REQUEST_LATENCY.labels(endpoint).observe(elapsed)
            if endpoint not in ("/metrics", "/healthz", "/readyz", "/readyz/pipeline") or status >= 400:
                log.info(
                    "%s %s %d",
                    scope.get("method"),
                    path,
                    status,
                    extra={
                        "fields": {
                            "method": scope.get("method"),
                            "path": path,
                            "status": status,
                            "ms": round(elapsed * 1000, 2),
                        }
                    },
                )

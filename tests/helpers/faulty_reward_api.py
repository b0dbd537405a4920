"""``FaultInjectingRewardApi``: a fault injector in front of the real reward API app (``services.reward_api``). It
passes every request to the real app and answers the real app's results, except that the ``reward`` (or another
reward field) of chosen items is replaced by an impossible value: ``NaN``, ``Infinity``, ``1e9``, ``-5``, written
as the JSON literals Python's encoder writes. It is NOT a stand-in for the service: every other number of every
answer is the real service's; it exists to produce what the real service cannot be made to answer on demand (a
broken build, a wrong config). Serve it with :class:`tests.helpers.servers.ThreadServer` (real uvicorn).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class FaultInjectingRewardApi:
    """ASGI middleware: in a 200 answer of ``/reward/*``, each result whose ``id`` starts with a key of ``rewards``
    gets that value in ``field``. ``injected``: the ``(id, value)`` pairs it wrote, in order; ``requests``: the
    reward requests it passed on."""

    def __init__(self, app: ASGIApp, rewards: Mapping[str, float], field: str = "reward") -> None:
        self.app = app
        self.rewards = dict(rewards)
        self.field = field
        self.injected: list[tuple[str, float]] = []
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith("/reward/"):
            await self.app(scope, receive, send)
            return
        self.requests += 1
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)  # sent with the body, once its length is known
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if start["status"] == 200:
                body = self._inject(body)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, rewrite)

    def _inject(self, body: bytes) -> bytes:
        answer = json.loads(body)
        for result in answer.get("results", []):
            item_id = str(result.get("id"))
            for prefix, value in self.rewards.items():
                if item_id.startswith(prefix):
                    result[self.field] = value
                    self.injected.append((item_id, value))
                    break
        return json.dumps(answer, allow_nan=True).encode()  # NaN and Infinity as JSON literals, as a broken service

"""``FaultInjectingDyingExecutor``: a :class:`~tests.helpers.faulty_executor.FaultyExecutor` that dies mid-run, as a
crashed executor does: its ``die_at``-th chat request (and any after it) gets no answer, and its server stops under
it; the connection is cut and the port then refuses connections. Its answers before that are ordinary answers.

``restarted()``: a fresh executor at the same port (the same URL), as the executor is after a restart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from tests.helpers.faulty_executor import FaultyExecutor


class FaultInjectingDyingExecutor(FaultyExecutor):
    def __init__(self, die_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.die_at = die_at
        self.died = threading.Event()
        self._kwargs = kwargs

    async def _answer(self, request: Request) -> Response:
        with self._lock:
            dying = len(self.requests) + 1 >= self.die_at
        if not dying:
            return await super()._answer(request)
        payload = await request.json()
        with self._lock:
            self.requests.append(payload)
        await asyncio.sleep(3600)  # never answered: the server stops under it
        return PlainTextResponse("too late", status_code=504)

    def start(self, timeout: float = 10.0) -> FaultInjectingDyingExecutor:
        super().start(timeout)

        def watch() -> None:
            while self._server is not None and self.calls < self.die_at:
                time.sleep(0.005)
            if self._server is not None:
                self.stop()
                self.died.set()

        threading.Thread(target=watch, name=f"dying-executor-{self.port}", daemon=True).start()
        return self

    def restarted(self) -> FaultyExecutor:
        """A healthy executor at this one's port, answering as this one did before it died (not started)."""
        fresh = FaultyExecutor(**self._kwargs)
        fresh.port = self.port
        return fresh

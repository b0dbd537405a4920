"""uvicorn's HTTP protocol with a header deadline: a connection that has not sent a complete request head
within ``HEADER_TIMEOUT_S`` of opening (or of its last answer) is closed. uvicorn alone waits forever for
the first request's headers (its keep-alive timeout only runs between requests), so idle sockets and
partial headers would hold connections (and ``MAX_CONNECTIONS`` slots) for as long as a client likes.

``python -m services.reward_api`` passes ``services.reward_api.protocol:HttpProtocol`` as uvicorn's
``http``; it is httptools' protocol when httptools is installed (uvicorn's own "auto" choice), else h11's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from services.reward_api import metrics
from services.reward_api.settings import get_settings

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - httptools is in the lock file
    _Base = H11Protocol  # type: ignore[assignment,misc]


class HttpProtocol(_Base):
    """``_Base`` plus the header deadline (module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self.loop.call_later(get_settings().header_timeout_s, self._header_deadline, self.cycle)

    def _header_deadline(self, armed: Any) -> None:
        # A new request head since arming replaces ``self.cycle``; the same, finished (or no) cycle means
        # nothing arrived in time.
        if self.cycle is armed and (armed is None or armed.response_complete) and not self.transport.is_closing():
            metrics.TIMEOUTS.labels("headers").inc()
            self.transport.close()

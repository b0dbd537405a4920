"""Real servers for tests: the reward_api under uvicorn as a subprocess, or any ASGI app under uvicorn
in a thread of the test process (so a test can reach into the app, e.g. a fault injector in front of it).

Fault-injecting executors live in ``tests/helpers/faulty_executor.py``; nothing here fakes a real part.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp

from services.executor_vllm.vllm_server import free_port
from services.reward_api.process import RewardApiProcess as RewardApiServer

__all__ = ["RewardApiServer", "ThreadServer"]


class ThreadServer:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: ASGIApp) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn thread server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

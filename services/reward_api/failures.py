"""Failure policy of the reward service: an infrastructure failure is never reported as a wrong answer.

Policy, applied by ``executor_client`` and ``pipeline``:

1. Every executor call (one attempt) has a deadline, ``EXECUTOR_TIMEOUT_S``. The executor phase of a
   request has a deadline, ``REQUEST_DEADLINE_S``; what is unfinished then has failed ("deadline").
2. Retries (``RETRIES`` after the first attempt, exponential back-off from ``RETRY_BACKOFF_S`` with
   jitter) happen ONLY for connection errors, HTTP 5xx and HTTP 429: those are transient. A timeout,
   a 4xx or a garbage answer (a 200 without ``choices[0].message.content``) is not retried: repeating
   it would cost another deadline for the same outcome.
3. A replica that fails with a connection error, timeout, 5xx or 429 is ejected for
   ``REPLICA_COOLDOWN_S``; retries go to another replica. If every replica is ejected, the one whose
   cool-down ends first is still tried, so the service recovers as soon as an executor is back.
4. After that, a failed item is either a 503 for the whole request (``on_executor_error="fail"``, the
   default) with ``{"error": "executor_unavailable" | "executor_bad_response", "detail": {"cause": ...}}``,
   or, when the request asks ``on_executor_error="penalize"``, the item gets
   ``shared.pipeline_reward_for_executor_failure`` (table part = invalid penalty) with
   ``error="executor_failed"`` and is counted in the response's ``failed``.
5. Every failure is counted in ``reward_api_failures_total{cls=...}`` and logged with its request id.
6. A Stage-2 prompt longer than the executor's context is bad input, not a failure (``PromptTooLong``):
   found before the call where the executor tells its ``max_model_len`` (``/v1/models``) and counts
   tokens (``/tokenize``), else recognised in vLLM's context-length 400. It is never retried, never
   ejects a replica, never fails the request or the other items, and is never ``executor_failed``: the
   item gets ``error="prompt_too_long"`` with its token count and the limit
   (``shared.pipeline_reward_for_prompt_too_long``), counted in the response's ``prompt_too_long``.
7. An answer cut at the executor's token limit (``finish_reason="length"``) is a configuration fault
   (``MAX_TOKENS`` too small for the table), never the policy's mistake: the item gets
   ``error="executor_truncated"`` (``shared.pipeline_reward_for_executor_truncated``: table part = invalid
   penalty, schema part kept), counted in the response's ``executor_truncated`` and in
   ``reward_api_failures_total{cls="executor_truncated"}``, and logged as a warning that names the fix.
8. Retries happen in this service only: the trainer's client does not retry a 503 whose ``error`` is
   ``executor_*`` (this policy already retried it). In ``fail`` mode the first failed call ends the
   request's executor phase; calls that no request awaits any more (its client disconnected, or it
   failed) are cancelled.
"""

from __future__ import annotations

import re
from typing import Literal

import aiohttp

Cause = Literal[
    "connect", "timeout", "http_429", "http_5xx", "http_4xx", "garbage", "deadline", "not_configured", "cancelled"
]

RETRYABLE: frozenset[Cause] = frozenset({"connect", "http_429", "http_5xx"})
EJECTING: frozenset[Cause] = frozenset({"connect", "timeout", "http_429", "http_5xx"})
UNAVAILABLE: frozenset[Cause] = frozenset(
    {"connect", "timeout", "http_429", "http_5xx", "deadline", "not_configured", "cancelled"}
)


class ExecutorFailure(Exception):
    """One executor call failed; ``cause`` is its class (see the module docstring)."""

    def __init__(self, cause: Cause, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.cause: Cause = cause
        self.message = message
        self.attempts = attempts

    @property
    def retryable(self) -> bool:
        return self.cause in RETRYABLE

    @property
    def error_code(self) -> str:
        """The 503 body's ``error``: the executor is unreachable/overloaded, or it answered nonsense."""
        return "executor_unavailable" if self.cause in UNAVAILABLE else "executor_bad_response"


def classify_transport_error(exc: BaseException) -> Cause:
    """Errors of the executor client (aiohttp) → cause. A connect timeout is a connection error; a read
    timeout (or the attempt's deadline) is a timeout."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect"
    if isinstance(exc, TimeoutError):  # aiohttp's SocketTimeoutError is one too
        return "timeout"
    # ClientConnectorError, ServerDisconnectedError (server went away mid-answer), ClientPayloadError, ...
    return "connect"


def classify_status(status: int) -> Cause | None:
    """HTTP status → cause; ``None`` for a success."""
    if status == 429:
        return "http_429"
    if status >= 500:
        return "http_5xx"
    if status >= 400:
        return "http_4xx"
    return None


class PromptTooLong(Exception):
    """The Stage-2 prompt does not fit the executor's context (policy point 6): the item's own outcome."""

    def __init__(self, tokens: int | None, limit: int | None, message: str) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit
        self.message = message


# vLLM's wording (vllm/renderers/params.py): "This model's maximum context length is N tokens. However,
# your prompt contains [at least] M input tokens, ..." or "... contains M characters (more than ...".
_CONTEXT_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS = re.compile(r"contains (?:at least )?(\d+) input tokens")


def context_length_error(status: int, body: str) -> PromptTooLong | None:
    """A ``PromptTooLong`` if this answer is vLLM's context-length 400, else ``None``."""
    if status != 400:
        return None
    limit = _CONTEXT_LIMIT.search(body)
    if limit is None:
        return None
    tokens = _PROMPT_TOKENS.search(body)
    return PromptTooLong(int(tokens.group(1)) if tokens else None, int(limit.group(1)), body[:300])

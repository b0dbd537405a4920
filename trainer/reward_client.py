"""The typed client of the reward API: every caller that asks reward_api for rewards asks here.

Contract, stated once (the HTTP side: docs/reward_api.md#contract):

- A request is a ``shared.wire`` request model (:class:`~shared.wire.SchemaRequest`,
  :class:`~shared.wire.TableRequest`, :class:`~shared.wire.PipelineRequest`); :func:`build_request` makes
  one from plain items and raises :class:`RewardRequestError` naming the field before anything is sent.
  Only the fields the caller set are sent, so the service's own reward defaults apply to the rest.
- An answer is parsed into the matching response model. One result per item, in request order, with the
  item's id: anything else raises :class:`RewardServiceError`.
- Every answer carries the service's ``prompt_version``; it must equal the version the caller built its
  data with (``expected_prompt_version``: ``shared.PROMPT_VERSION`` or ``shared.prompt_version(...)``).
  A difference raises :class:`PromptVersionMismatch` naming both versions and the URL: a π2 trained on
  one Stage-2 template must never be scored with another without anyone noticing. It is never retried.
- Retries (``max_attempts``, 1 = none; exponential backoff from ``backoff_s``, at most 10 s): connection
  errors, timeouts of one attempt, HTTP 5xx and 429 only. A 503 whose ``error`` is ``executor_*`` is not
  retried (the service retried its executor calls already: retries live in one layer). Another 4xx is a
  bug in our request and raises :class:`RewardRequestError` at once with the service's message. After the
  last attempt :class:`RewardServiceError` is raised: a failed call never becomes a score.

:class:`RewardClient` is synchronous (httpx); :class:`AsyncRewardClient` is the same contract on an event
loop, for VERL's reward function (:mod:`trainer.in_verl.reward_batcher` batches samples over it) and load
benchmarks. This module imports ``shared`` and httpx only: VERL's processes load it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, overload

import httpx
from pydantic import ValidationError

from shared.wire import (
    PipelineItem,
    PipelineRequest,
    PipelineResponse,
    PipelineResult,
    SchemaItem,
    SchemaRequest,
    SchemaResponse,
    SchemaResult,
    TableItem,
    TableRequest,
    TableResponse,
    TableResult,
)

RewardEndpoint: TypeAlias = Literal["schema", "table", "pipeline"]
RewardRequest: TypeAlias = SchemaRequest | TableRequest | PipelineRequest
RewardResponse: TypeAlias = SchemaResponse | TableResponse | PipelineResponse

REQUESTS: dict[RewardEndpoint, type[RewardRequest]] = {
    "schema": SchemaRequest,
    "table": TableRequest,
    "pipeline": PipelineRequest,
}
RESPONSES: dict[type[RewardRequest], tuple[RewardEndpoint, type[RewardResponse]]] = {
    SchemaRequest: ("schema", SchemaResponse),
    TableRequest: ("table", TableResponse),
    PipelineRequest: ("pipeline", PipelineResponse),
}
MAX_BACKOFF_S = 10.0


class RewardServiceError(RuntimeError):
    """The reward API did not answer usefully after all retries (or answered a non-retryable 4xx)."""


class RewardRequestError(RewardServiceError):
    """Our request is wrong (the service refused it with a 4xx other than 429, or it failed the wire model
    before sending): a bug to fix, never masked as an infrastructure failure."""


class PromptVersionMismatch(RewardRequestError):
    """The service builds its prompts from other templates than the caller built its data with."""

    def __init__(self, url: str, expected: str, served: str) -> None:
        super().__init__(
            f"{url}: the reward API answers with prompt_version {served!r} but this caller built its data with "
            f"prompt_version {expected!r}: serve the reward API with the prompt templates the data was built with "
            "(its stage-2 template setting), or rebuild the data with the served ones"
        )
        self.url, self.expected, self.served = url, expected, served

    def __reduce__(self) -> tuple[type[PromptVersionMismatch], tuple[str, str, str]]:
        return type(self), (self.url, self.expected, self.served)  # picklable: Ray carries it between processes


@overload
def build_request(
    endpoint: Literal["schema"], items: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None
) -> SchemaRequest: ...
@overload
def build_request(
    endpoint: Literal["table"], items: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None
) -> TableRequest: ...
@overload
def build_request(
    endpoint: Literal["pipeline"],
    items: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> PipelineRequest: ...
@overload
def build_request(
    endpoint: RewardEndpoint,
    items: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> RewardRequest: ...
def build_request(
    endpoint: RewardEndpoint,
    items: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> RewardRequest:
    """The wire request of ``endpoint`` for plain ``items`` and reward ``config`` overrides; ``options`` are the
    request's other fields (``debug``, ``on_executor_error``). A field the wire rejects raises
    :class:`RewardRequestError` naming it."""
    if endpoint not in REQUESTS:
        raise ValueError(f"endpoint must be one of {list(REQUESTS)}, got {endpoint!r}")
    body: dict[str, Any] = {"items": list(items), **options}
    if config:
        body["config"] = dict(config)
    try:
        return REQUESTS[endpoint].model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise RewardRequestError(f"/reward/{endpoint} request: {loc}: {err['msg']}") from None


def _service_error(resp: httpx.Response) -> str:
    """The ``error`` of the service's ``ErrorBody``, or "" if the answer is not one (a proxy's page)."""
    try:
        body = resp.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, str) else ""


def retryable(exc: BaseException) -> bool:
    """Whether one failed attempt may be tried again (the module's retry policy)."""
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        if code == 503 and _service_error(exc.response).startswith("executor_"):
            return False  # the service already retried its executor calls (one retrying layer, not two)
        return code == 429 or code >= 500
    return isinstance(exc, httpx.TransportError)


class _Base:
    """What the sync and async clients share: settings, the request's body, the answer's checks."""

    def __init__(
        self,
        url: str,
        expected_prompt_version: str,
        *,
        token: str | None = None,
        timeout_s: float = 600.0,
        max_attempts: int = 1,
        backoff_s: float = 0.5,
        max_connections: int = 16,
        on_attempt: Callable[[], None] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.url = url.rstrip("/")
        self.expected_prompt_version = expected_prompt_version
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._on_attempt = on_attempt
        self._http_options: dict[str, Any] = {
            "headers": {"Authorization": f"Bearer {token}"} if token else {},
            "timeout": httpx.Timeout(timeout_s),
            "limits": httpx.Limits(max_connections=max_connections),
        }

    def endpoint_url(self, request: RewardRequest) -> str:
        return f"{self.url}/reward/{RESPONSES[type(request)][0]}"

    def _body(self, request: RewardRequest) -> bytes:
        return request.model_dump_json(exclude_unset=True).encode()

    def _backoff(self, attempt: int) -> float:
        return float(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))

    def _count_attempt(self) -> None:
        if self._on_attempt is not None:
            self._on_attempt()

    def _answer(self, url: str, request: RewardRequest, resp: httpx.Response) -> RewardResponse:
        """The checked answer of one attempt; raises ``httpx.HTTPStatusError`` for a retryable status."""
        if resp.status_code >= 400:
            if resp.status_code != 429 and resp.status_code < 500:
                raise RewardRequestError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
            resp.raise_for_status()
        response_model = RESPONSES[type(request)][1]
        try:
            answer = response_model.model_validate_json(resp.content)
        except ValidationError as exc:
            raise RewardServiceError(f"{url}: the answer is not a {response_model.__name__}: {exc}") from None
        if answer.prompt_version != self.expected_prompt_version:
            raise PromptVersionMismatch(url, self.expected_prompt_version, answer.prompt_version)
        if len(answer.results) != len(request.items):
            raise RewardServiceError(f"{url}: {len(answer.results)} results for {len(request.items)} items")
        items: Sequence[SchemaItem | TableItem | PipelineItem] = request.items
        results: Sequence[SchemaResult | TableResult | PipelineResult] = answer.results
        for item, result in zip(items, results, strict=True):
            if result.id != item.id:
                raise RewardServiceError(f"{url}: result id {result.id!r} != item id {item.id!r}")
        return answer

    def _final_error(self, url: str, exc: Exception, tries: int) -> RewardServiceError:
        if isinstance(exc, httpx.HTTPStatusError):
            err = RewardServiceError(
                f"{url}: HTTP {exc.response.status_code} after {tries} attempt(s): {exc.response.text[:500]}"
            )
        else:
            err = RewardServiceError(f"{url}: {type(exc).__name__} after {tries} attempts: {exc}")
        err.__cause__ = exc
        return err


class RewardClient(_Base):
    """Synchronous client of ``/reward/{schema,table,pipeline}`` (the module's contract); use it as a context
    manager, or call :meth:`close`. Thread-safe: threads may share one client."""

    def __init__(self, url: str, expected_prompt_version: str, **kwargs: Any) -> None:
        super().__init__(url, expected_prompt_version, **kwargs)
        self._http = httpx.Client(**self._http_options)

    @overload
    def score(self, request: SchemaRequest) -> SchemaResponse: ...
    @overload
    def score(self, request: TableRequest) -> TableResponse: ...
    @overload
    def score(self, request: PipelineRequest) -> PipelineResponse: ...
    def score(self, request: RewardRequest) -> RewardResponse:
        """POST ``request`` to its endpoint; the checked, typed answer (or an error, never a made-up score)."""
        url = self.endpoint_url(request)
        body = self._body(request)
        for attempt in range(1, self.max_attempts + 1):
            self._count_attempt()
            try:
                resp = self._http.post(url, content=body, headers={"content-type": "application/json"})
                return self._answer(url, request, resp)
            except (httpx.HTTPStatusError, httpx.TransportError) as exc:
                if attempt == self.max_attempts or not retryable(exc):
                    raise self._final_error(url, exc, attempt) from exc
                time.sleep(self._backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRewardClient(_Base):
    """The same client on an event loop (``await client.score(request)``); close with :meth:`aclose`."""

    def __init__(self, url: str, expected_prompt_version: str, **kwargs: Any) -> None:
        super().__init__(url, expected_prompt_version, **kwargs)
        self._http = httpx.AsyncClient(**self._http_options)

    @overload
    async def score(self, request: SchemaRequest) -> SchemaResponse: ...
    @overload
    async def score(self, request: TableRequest) -> TableResponse: ...
    @overload
    async def score(self, request: PipelineRequest) -> PipelineResponse: ...
    async def score(self, request: RewardRequest) -> RewardResponse:
        """POST ``request`` to its endpoint; the checked, typed answer (see :meth:`RewardClient.score`)."""
        url = self.endpoint_url(request)
        body = self._body(request)
        for attempt in range(1, self.max_attempts + 1):
            self._count_attempt()
            try:
                resp = await self._http.post(url, content=body, headers={"content-type": "application/json"})
                return self._answer(url, request, resp)
            except (httpx.HTTPStatusError, httpx.TransportError) as exc:
                if attempt == self.max_attempts or not retryable(exc):
                    raise self._final_error(url, exc, attempt) from exc
                await asyncio.sleep(self._backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

"""VERL's per-sample reward calls, batched over the typed reward client (docs/trainer.md).

Failure policy (applied by :class:`RewardBatcher` and :func:`score_dict`, stated here once):

- VERL calls the reward function once per sample, concurrently, inside one event loop per
  ``RewardLoopWorker`` process. Concurrent calls for the same endpoint and config are coalesced
  into one ``POST`` of at most ``max_batch`` items, sent when the batch is full or ``max_wait_ms``
  after its first item arrived, whichever comes first.
- Every call has a deadline (``timeout_s``, counted from when the sample was submitted). A call that
  passes it raises :class:`RewardTimeoutError`; nothing waits forever.
- One batch is one call of the typed client, :class:`trainer.reward_client.AsyncRewardClient`, which owns
  the retries (safe: scoring is idempotent; connection errors, attempt timeouts, 5xx and 429 only, never a
  503 ``executor_*``: the service retried its executor already), raises at once on a 4xx with the service's
  message, and checks the answer's ``prompt_version`` against the sample's data (its
  ``extra_info.prompt_version``): a mismatch raises :class:`~trainer.reward_client.PromptVersionMismatch`
  naming both versions, never masked.
- After the last attempt the error RAISES (:class:`RewardServiceError`). A made-up score would be
  silently trained on, so there is none.
- Every reward an answer carries is checked (:class:`RewardRanges`): a finite number inside the range its kind
  declares, ``[min_reward, max_reward]`` of the request's config (the defaults −1..1, or the phase's
  ``schema_config`` / ``table_config`` / ``pipeline_config`` overrides; the pipeline's ``schema_reward`` and
  ``table_reward`` parts within their own parts' bounds). A reward that is not (``NaN``, ``inf``, ``1e9``, ``-5``)
  is a broken service, never the policy's score: in ``mask`` mode the sample is masked with cause
  ``reward_not_finite`` or ``reward_out_of_range``; in ``penalize`` mode it raises
  :class:`ImpossibleRewardError` (VERL counts the prompt group failed, the failure log names it). Either way a
  warning names the value, the range and the endpoint.
- An answer that is an infrastructure or configuration failure, never the policy's mistake (the executor
  failed after the service's retries, ``executor_failed``; it stopped at its token limit,
  ``executor_truncated``; the document plus the schema do not fit its context, ``prompt_too_long``) is
  handled by ``failure_mode`` (the phase's ``failures.mode``):

  - ``mask`` (the default): the service is asked for per-item answers (``on_executor_error="penalize"``)
    and such an item comes back as a **masked** sample: ``score`` 0, ``masked`` = 1 and its cause's key
    = 1. The phase's trainer gives it no gradient and leaves it out of its group's mean and std
    (:mod:`trainer.phase_rules.failure_mask`); the reward function turns a call that raised into a masked
    sample too (``reward_call_failed``).
  - ``penalize`` (opt-in, named so): the table part gets the service's penalty and VERL trains on it;
    ``executor_failed``, ``prompt_too_long`` and ``executor_truncated`` still say why. A warning names the
    fix of ``prompt_too_long`` (drop such documents: ``trainer data build --stage2-tokenizer DIR
    --stage2-max-len N``, or serve the executor with a longer ``--max-model-len``) and of
    ``executor_truncated`` (raise the reward API's max_tokens).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

from shared import EXECUTOR_TRUNCATED, PROMPT_TOO_LONG, PROMPT_VERSION
from shared.rewards import PipelineSchemaRewardConfig, RewardBounds, SchemaRewardConfig, TableRewardConfig
from shared.wire import PipelineResult, SchemaResult, TableResult
from trainer.phase_rules.failure_mask import (
    FAILURE_CAUSES,
    MASK_KEY,
    REWARD_NOT_FINITE,
    REWARD_OUT_OF_RANGE,
    SERVICE_CAUSES,
    FailureMode,
)
from trainer.registry.data_source import reward_kind
from trainer.reward_client import (
    REQUESTS,
    AsyncRewardClient,
    PromptVersionMismatch,
    RewardEndpoint,
    RewardRequestError,
    RewardServiceError,
    build_request,
)

__all__ = [  # re-exported: VERL's errors
    "ImpossibleRewardError",
    "PromptVersionMismatch",
    "RewardRequestError",
    "RewardServiceError",
]

log = logging.getLogger("trainer.in_verl.reward_batcher")

# The part keys returned for every sample of a data source: VERL takes the key list from the first
# sample, so they must never vary (docs/notes/verl-0.9.md, "Known user pain").
SCORE_KEYS: dict[str, tuple[str, ...]] = {
    "schema": ("score", "valid_json", "precision", "recall", "f1"),
    "table": ("score", "valid_json", "table_score", "cell_accuracy"),
    "pipeline": (
        "score",
        "schema_reward",
        "table_reward",
        "valid_json",
        "f1",
        "table_score",
        "cell_accuracy",
        "executor_failed",
        "prompt_too_long",
        "executor_truncated",
    ),
}
for _kind in SCORE_KEYS:  # every data source reports the mask and its causes (trainer.phase_rules.failure_mask)
    SCORE_KEYS[_kind] += tuple(k for k in (MASK_KEY, *FAILURE_CAUSES) if k not in SCORE_KEYS[_kind])


class RewardTimeoutError(RewardServiceError, TimeoutError):
    """A sample's deadline passed before its batch came back."""


class ImpossibleRewardError(RewardServiceError):
    """The service answered a reward that is not finite or outside its declared range (``penalize`` mode: in
    ``mask`` mode such a sample is masked instead)."""


class RewardClientConfig(BaseModel):
    """Client settings, from ``reward_kwargs`` (VERL) or the environment the launcher sets
    (``TRAINER_REWARD_URL`` / ``TRAINER_REWARD_TOKEN``, see :data:`URL_ENV`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Base URL of the reward API, e.g. http://127.0.0.1:8000.")
    # SecretStr: a config printed or logged shows '**********', never the token
    token: SecretStr | None = Field(None, description="Bearer token sent as Authorization header.")
    # The outermost deadline of a reward (docs/reliability.md, "Deadline budget"): longer than the reward service
    # can take to answer (its queue wait 60 s + body 15 s + executor phase 300 s + scoring), so the service's
    # own, named error always arrives first; VERL puts no deadline of its own on a reward.
    timeout_s: float = Field(420.0, gt=0, description="Deadline of one sample's reward, retries included.")
    attempt_timeout_s: float | None = Field(
        None, gt=0, description="Timeout of one HTTP attempt (default: the deadline)."
    )
    max_batch: int = Field(64, ge=1, description="Most items in one POST.")
    max_wait_ms: float = Field(20.0, ge=0, description="How long the first item of a batch waits for company.")
    max_attempts: int = Field(4, ge=1, description="HTTP attempts per batch (1 = no retry).")
    backoff_s: float = Field(0.5, ge=0, description="First retry backoff; doubles per attempt, max 10 s.")
    failure_mode: FailureMode = Field(
        "mask",
        description="An executor failure, truncation or prompt_too_long: 'mask' (no gradient, out of the group's "
        "baseline) or 'penalize' (the service's penalty is trained on).",
    )
    schema_config: dict[str, Any] = Field(default_factory=dict, description="SchemaRewardConfig overrides.")
    table_config: dict[str, Any] = Field(default_factory=dict, description="TableRewardConfig overrides.")
    pipeline_config: dict[str, Any] = Field(default_factory=dict, description="PipelineSchemaRewardConfig overrides.")

    _key: str = PrivateAttr("")

    def reward_config(self, data_source: str) -> dict[str, Any]:
        return {"schema": self.schema_config, "table": self.table_config, "pipeline": self.pipeline_config}[data_source]

    def key(self) -> str:
        """What tells two configs apart (computed once per config): its dump, which shows a SecretStr as
        '**********', and the token's hash, which keeps two tokens apart."""
        if not self._key:
            token = hashlib.sha256(self.token.get_secret_value().encode()).hexdigest() if self.token else ""
            self._key = f"{self.model_dump_json()}|{token}"
        return self._key


def _plain(value: Any) -> Any:
    """OmegaConf containers (VERL's reward_kwargs) and JSON strings → plain Python values."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


# The launcher's names for the reward API's URL and token in VERL's processes (``trainer run`` sets them
# from --reward-url and the user's variables: trainer/serving/reward_api_env.py, which this module may
# not import; a test holds the names equal).
URL_ENV = "TRAINER_REWARD_URL"
TOKEN_ENV = "TRAINER_REWARD_TOKEN"

_KWARG_ALIASES = {"timeout": "timeout_s", "api_url": "url", "reward_api_url": "url"}
_CONFIG_KEYS = ("schema_config", "table_config", "pipeline_config")


TOKEN_IN_CONFIG = (
    "the reward API token comes from the environment only (the user's token variable, which `trainer run` passes "
    f"to VERL's processes as ${TOKEN_ENV}): as a config key it is written to command.sh, phase_result.json, the "
    "loop's manifest and VERL's config log"
)


def client_config_from_kwargs(kwargs: Mapping[str, Any]) -> RewardClientConfig:
    """Build the config from VERL ``reward_kwargs``; unknown keys are an error that names them. The token is
    read from ``$TRAINER_REWARD_TOKEN`` only (:data:`TOKEN_IN_CONFIG` says why)."""
    raw: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in ("reward_router_address", "reward_model_tokenizer"):
            continue  # passed by VERL's managers for reward models; not ours
        if key == "token" and value:
            raise ValueError(f"reward_kwargs.token: {TOKEN_IN_CONFIG}")
        name = _KWARG_ALIASES.get(key, key)
        value = _plain(value)
        if name in _CONFIG_KEYS and isinstance(value, str):
            value = json.loads(value)
        raw[name] = value
    raw.setdefault("url", os.environ.get(URL_ENV))
    raw["token"] = os.environ.get(TOKEN_ENV) or None
    if not raw["url"]:
        raise ValueError(
            f"reward API url missing: set reward_kwargs.url or {URL_ENV} (`trainer run` sets it from "
            "--reward-url or the reward API URL of its environment, docs/trainer.md)"
        )
    try:
        return RewardClientConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"reward_kwargs.{loc}: {err['msg']}") from None


def cached_client_config(kwargs: Mapping[str, Any]) -> RewardClientConfig:
    """:func:`client_config_from_kwargs`, built once per worker process for each distinct ``reward_kwargs`` and
    environment (VERL calls the reward function once per sample with the same kwargs). The key is the kwargs as
    plain JSON plus :data:`URL_ENV` and :data:`TOKEN_ENV`, which the config reads; kwargs that are not plain JSON
    are built every time. A config that is an error is never cached: each call raises it again."""
    try:
        key = json.dumps(_plain(dict(kwargs)), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return client_config_from_kwargs(kwargs)
    return _config_of(key, os.environ.get(URL_ENV), os.environ.get(TOKEN_ENV))


@functools.lru_cache(maxsize=64)
def _config_of(kwargs_json: str, _url_env: str | None, _token_env: str | None) -> RewardClientConfig:
    return client_config_from_kwargs(json.loads(kwargs_json))


WireResult = SchemaResult | TableResult | PipelineResult

# The config each endpoint's request carries: every reward it answers is clipped to that config's bounds.
REWARD_CONFIGS: dict[str, type[RewardBounds]] = {
    "schema": SchemaRewardConfig,
    "table": TableRewardConfig,
    "pipeline": PipelineSchemaRewardConfig,
}


@dataclass(frozen=True)
class RewardRanges:
    """The range every reward of one endpoint's answer must be in (``shared.rewards`` clips each to its config's
    ``[min_reward, max_reward]``): ``reward``, and for the pipeline its ``schema_reward`` and ``table_reward`` parts
    within their parts' bounds."""

    endpoint: str
    bounds: tuple[tuple[str, float, float], ...]

    @classmethod
    def of(cls, endpoint: str, reward_config: Mapping[str, Any]) -> RewardRanges:
        """The ranges a request with these config overrides declares (the config was validated by the request)."""
        if endpoint not in REWARD_CONFIGS:
            raise ValueError(f"data_source must be one of {list(REWARD_CONFIGS)}, got {endpoint!r}")
        cfg = REWARD_CONFIGS[endpoint].model_validate(dict(reward_config))
        bounds = [("reward", cfg.min_reward, cfg.max_reward)]
        if isinstance(cfg, PipelineSchemaRewardConfig):
            for part, sub in (("schema_reward", cfg.schema_reward), ("table_reward", cfg.table_reward)):
                bounds.append((part, sub.min_reward, sub.max_reward))
        return cls(endpoint, tuple(bounds))

    def problem(self, result: Mapping[str, Any]) -> tuple[str, str] | None:
        """``(cause, what)`` of the first reward of ``result`` that is not finite or out of its range; None if
        every one is possible."""
        for key, low, high in self.bounds:
            value = float(result[key])
            if not math.isfinite(value):
                return REWARD_NOT_FINITE, f"{key}={value!r} (declared range [{low:g}, {high:g}])"
            if not low <= value <= high:
                return REWARD_OUT_OF_RANGE, f"{key}={value!r} outside its declared range [{low:g}, {high:g}]"
        return None


@functools.cache
def default_ranges(endpoint: str) -> RewardRanges:
    """The ranges of a request without config overrides (−1..1)."""
    return RewardRanges.of(endpoint, {})


@dataclass
class _Pending:
    item: dict[str, Any]
    future: asyncio.Future[WireResult]


@dataclass
class BatcherStats:
    """Counters for tests and logs."""

    requests: int = 0
    attempts: int = 0
    items: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class RewardBatcher:
    """Coalesces concurrent single-item reward calls on one event loop into batched POSTs, sent through
    :class:`trainer.reward_client.AsyncRewardClient` (its retries, its checks of each answer)."""

    def __init__(
        self,
        endpoint: str,
        cfg: RewardClientConfig,
        reward_config: Mapping[str, Any],
        expected_prompt_version: str = PROMPT_VERSION,
    ) -> None:
        if endpoint not in REQUESTS:
            raise ValueError(f"data_source must be one of {list(REQUESTS)}, got {endpoint!r}")
        self.endpoint: RewardEndpoint = endpoint
        self.cfg = cfg
        self.url = f"{cfg.url.rstrip('/')}/reward/{endpoint}"
        self.reward_config = dict(reward_config)
        self.ranges = RewardRanges.of(endpoint, self.reward_config)
        self.stats = BatcherStats()
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._client = AsyncRewardClient(
            cfg.url,
            expected_prompt_version,
            token=cfg.token.get_secret_value() if cfg.token else None,
            timeout_s=cfg.attempt_timeout_s or cfg.timeout_s,
            max_attempts=cfg.max_attempts,
            backoff_s=cfg.backoff_s,
            on_attempt=self._count_attempt,
        )

    def _count_attempt(self) -> None:
        self.stats.attempts += 1

    async def submit(self, item: dict[str, Any]) -> WireResult:
        """Queue one item; return its wire result, or raise after the deadline / the retries."""
        loop = asyncio.get_running_loop()
        pending = _Pending(item, loop.create_future())
        self._pending.append(pending)
        if len(self._pending) >= self.cfg.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.cfg.max_wait_ms / 1000.0, self._flush)
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout=self.cfg.timeout_s)
        except TimeoutError:
            raise RewardTimeoutError(
                f"reward {self.url}: no answer within the {self.cfg.timeout_s} s deadline (item {item.get('id')})"
            ) from None

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        started = time.monotonic()
        # pipeline: per-item answers, so the failure_mode decides what a failed sample becomes
        options = {"on_executor_error": "penalize"} if self.endpoint == "pipeline" else {}
        self.stats.requests += 1
        self.stats.items += len(batch)
        self.stats.batch_sizes.append(len(batch))
        try:
            request = build_request(self.endpoint, [p.item for p in batch], self.reward_config, **options)
            async with asyncio.timeout(self.cfg.timeout_s):
                results: list[WireResult] = list((await self._client.score(request)).results)
        except BaseException as exc:  # every waiter must learn about any failure
            err: BaseException = exc
            if isinstance(exc, TimeoutError):
                err = RewardTimeoutError(
                    f"{self.url}: batch of {len(batch)} timed out after {time.monotonic() - started:.1f} s"
                )
            elif not isinstance(exc, RewardServiceError):
                err = RewardServiceError(f"{self.url}: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
                    p.future.exception()  # a waiter that already timed out must not log "never retrieved"
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for p, res in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(res)

    async def aclose(self) -> None:
        await self._client.aclose()


# One batcher per (event loop, endpoint, client config): VERL's RewardLoopWorker runs one loop per
# process, tests run many. A loop that is gone drops its batchers with it.
_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, RewardBatcher]] = weakref.WeakKeyDictionary()
_ids = itertools.count()


def get_batcher(
    data_source: str, cfg: RewardClientConfig, expected_prompt_version: str = PROMPT_VERSION
) -> RewardBatcher:
    """The batcher of the running loop for this endpoint, config and expected prompt version (created on first
    use)."""
    if data_source not in SCORE_KEYS:
        raise ValueError(f"data_source must be one of {list(SCORE_KEYS)}, got {data_source!r}")
    loop = asyncio.get_running_loop()
    per_loop = _BATCHERS.setdefault(loop, {})
    key = f"{data_source}|{cfg.key()}|{expected_prompt_version}"
    batcher = per_loop.get(key)
    if batcher is None:
        reward_config = cfg.reward_config(data_source)
        batcher = per_loop[key] = RewardBatcher(data_source, cfg, reward_config, expected_prompt_version)
    return batcher


def batchers_of_running_loop() -> list[RewardBatcher]:
    """The batchers of the running loop (for tests and shutdown)."""
    return list(_BATCHERS.get(asyncio.get_running_loop(), {}).values())


def decode_ground_truth(ground_truth: Any) -> dict[str, Any]:
    """Ground truth as stored in the parquet (a JSON string) or already decoded."""
    value = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else _plain(ground_truth)
    if not isinstance(value, dict):
        raise ValueError(f"ground_truth must be a JSON object, got {type(value).__name__}")
    return value


def build_item(data_source: str, item_id: str, solution_str: str, ground_truth: Mapping[str, Any]) -> dict[str, Any]:
    """The wire item of one sample (docs/reward_api.md#contract); a missing ground-truth field is named."""

    def need(key: str) -> Any:
        if key not in ground_truth:
            raise ValueError(f"ground_truth of {data_source!r} sample {item_id!r} lacks field '{key}'")
        return ground_truth[key]

    if data_source == "schema":
        return {"id": item_id, "prediction": solution_str, "gold_schema": need("schema")}
    if data_source == "table":
        return {"id": item_id, "prediction": solution_str, "gold_table": need("table")}
    if data_source == "pipeline":
        return {
            "id": item_id,
            "prediction": solution_str,
            "text": need("text"),
            "gold_schema": need("schema"),
            "gold_table": need("table"),
        }
    raise ValueError(f"data_source must be one of {list(SCORE_KEYS)}, got {data_source!r}")


def score_dict(
    data_source: str,
    result: WireResult | Mapping[str, Any],
    failure_mode: FailureMode = "mask",
    ranges: RewardRanges | None = None,
) -> dict[str, float]:
    """Map a wire result (the parsed model, or its JSON object) onto VERL's ``{"score", ...parts}``; the same
    keys for every sample. In ``mask`` mode an executor failure, truncation or prompt_too_long is a masked
    sample (:func:`masked_score`). Every reward is checked against ``ranges`` (the request's; default: a request
    without config overrides): one that is not finite or out of range is masked with that cause in ``mask`` mode
    and raises :class:`ImpossibleRewardError` in ``penalize`` mode."""
    if not isinstance(result, Mapping):
        result = vars(result)  # the model's fields by name: the wire's names, not copied
    error = result.get("error")
    if failure_mode == "mask" and error in SERVICE_CAUSES:
        return masked_score(data_source, str(error))
    problem = (ranges or default_ranges(data_source)).problem(result)
    if problem is not None:
        cause, what = problem
        message = f"reward/{data_source} answered an impossible reward for item {result.get('id')!r}: {what}"
        _warn_impossible(cause, message, failure_mode)
        if failure_mode == "mask":
            return masked_score(data_source, cause)
        raise ImpossibleRewardError(f"{message} ({cause})")
    out = dict.fromkeys(SCORE_KEYS[data_source], 0.0)
    out.update(score=float(result["reward"]), valid_json=float(bool(result["valid_json"])))
    if data_source == "schema":
        out.update(precision=float(result["precision"]), recall=float(result["recall"]), f1=float(result["f1"]))
    elif data_source == "table":
        out.update(table_score=float(result["table_score"]), cell_accuracy=float(result["cell_accuracy"]))
    else:
        out.update(
            schema_reward=float(result["schema_reward"]),
            table_reward=float(result["table_reward"]),
            f1=float(result["f1"]),
            table_score=float(result["table_score"]),
            cell_accuracy=float(result["cell_accuracy"]),
        )
        if error in SERVICE_CAUSES:
            out[str(error)] = 1.0
        if error == PROMPT_TOO_LONG:
            _warn_prompt_too_long(result)
        elif error == EXECUTOR_TRUNCATED:
            _warn_truncated()
    return {k: out[k] for k in SCORE_KEYS[data_source]}


def masked_score(data_source: str, cause: str) -> dict[str, float]:
    """The parts of a masked sample: score 0, ``masked`` 1 and ``cause`` 1 (the trainer gives it no gradient and
    leaves it out of its group's baseline; validation leaves it out of the score)."""
    if data_source not in SCORE_KEYS:
        raise ValueError(f"data_source must be one of {list(SCORE_KEYS)}, got {data_source!r}")
    if cause not in FAILURE_CAUSES:
        raise ValueError(f"failure cause must be one of {list(FAILURE_CAUSES)}, got {cause!r}")
    out = dict.fromkeys(SCORE_KEYS[data_source], 0.0)
    out.update({MASK_KEY: 1.0, cause: 1.0})
    return out


_too_long_seen = itertools.count(1)
_truncated_seen = itertools.count(1)
_impossible_seen = itertools.count(1)


def _warn_impossible(cause: str, message: str, failure_mode: FailureMode) -> None:
    """A reward outside its declared range is a broken reward service: say so on the first and every 100th."""
    n = next(_impossible_seen)
    if n == 1 or n % 100 == 0:
        what = "masked" if failure_mode == "mask" else "failed (penalize mode)"
        log.warning(
            "%d sample(s) so far with an impossible reward, %s as %s; last: %s. The reward service is broken "
            "(its version or its config): no such reward is trained on.",
            n,
            what,
            cause,
            message,
        )


def _warn_truncated() -> None:
    """A table cut at the executor's token limit is a configuration fault, not the policy's mistake."""
    n = next(_truncated_seen)
    if n == 1 or n % 100 == 0:
        log.warning(
            "%d sample(s) so far with executor_truncated: the executor stopped at its max_tokens before the "
            "table ended, so the table part got its penalty (failures.mode penalize). Raise the reward API's "
            "max_tokens setting (docs/reward_api.md).",
            n,
        )


def _warn_prompt_too_long(result: Mapping[str, Any]) -> None:
    """Say plainly what to do, on the first such sample and then every 100th (not once per sample)."""
    n = next(_too_long_seen)
    if n == 1 or n % 100 == 0:
        log.warning(
            "%d sample(s) so far with prompt_too_long (last: %s tokens, executor context %s): the document plus "
            "the predicted schema do not fit the executor, so the table part got its penalty (failures.mode "
            "penalize). Drop these documents from the training data (`trainer data build --stage2-tokenizer DIR "
            "--stage2-max-len N` counts and drops them) or serve the executor with a longer --max-model-len.",
            n,
            result.get("prompt_tokens", "?"),
            result.get("prompt_limit", "?"),
        )


async def score_one(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    cfg: RewardClientConfig,
    item_id: str | None = None,
    expected_prompt_version: str | None = None,
) -> dict[str, float]:
    """Score one sample through the running loop's batcher. ``data_source`` may carry its golden source
    (``table:wikitabletext``, :mod:`trainer.registry.data_source`): the kind picks the endpoint, and samples of
    every source share one batcher. ``expected_prompt_version`` is the version the sample's data was built
    with (its ``extra_info.prompt_version``; default ``shared.PROMPT_VERSION``): an answer with another one
    raises :class:`~trainer.reward_client.PromptVersionMismatch`."""
    kind = reward_kind(data_source)
    gt = decode_ground_truth(ground_truth)
    uid = f"{item_id or 'sample'}#{next(_ids)}"
    item = build_item(kind, uid, solution_str, gt)
    batcher = get_batcher(kind, cfg, expected_prompt_version or PROMPT_VERSION)
    result = await batcher.submit(item)
    return score_dict(kind, result, cfg.failure_mode, batcher.ranges)

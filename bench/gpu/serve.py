"""Start, wait for and stop stock vLLM executors, one per GPU, on a GPU node.

    python3 -m bench.gpu.serve start --model DIR --name NAME --gpus 0,1,2,3 --port 18201 [--mem 0.3]
    python3 -m bench.gpu.serve wait --ports 18201,18202
    python3 -m bench.gpu.serve stop --ports 18201,18202

Each executor gets ``CUDA_VISIBLE_DEVICES=<its GPU>`` and port ``--port + i``; it is built by
:func:`trainer.serving.executors.executor_for` (the loop's executor) and launched detached: a session of
its own, not ended with this command (it outlives the shell command that started it, as the device's
runs need). It leaves ``/tmp/stx-vllm-<port>.pid`` and ``.log`` behind; ``stop`` ends exactly those
PIDs' process groups.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from services.executor_vllm.cpu_launcher import CpuExecutor
from trainer.serving.executors import executor_for
from trainer.serving.gpus import ExecutorSlot

RUN_DIR = Path(os.environ.get("STX_VLLM_RUN_DIR", "/tmp"))


def executor(
    model: str, name: str, gpu: str, port: int, mem: float, prefix_cache: bool = True, eager: bool = False
) -> CpuExecutor:
    """The loop's GPU executor (bf16, seed 0, loopback, NVLink multicast off, no flashinfer), with a
    compile cache of its own (executors that start together never race on one); this module only runs
    it detached and keeps its PID file."""
    return executor_for(
        model, RUN_DIR / f"stx-vllm-{port}.log", ExecutorSlot((gpu,), mem), eager=eager, served_name=name,
        port=port, prefix_caching=prefix_cache, extra_env={"VLLM_CACHE_ROOT": str(RUN_DIR / f"stx-vllm-cache-{port}")},
    )  # fmt: skip


def assign(gpus: Sequence[str], port: int) -> list[tuple[str, int]]:
    """(GPU, port) per executor: one GPU each, consecutive ports."""
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {list(gpus)}: each executor needs a GPU of its own")
    return [(g, port + i) for i, g in enumerate(gpus)]


def start(
    model: str, name: str, gpus: Sequence[str], port: int, mem: float, prefix_cache: bool, eager: bool = False
) -> list[int]:
    ports = []
    for gpu, p in assign(gpus, port):
        ex = executor(model, name, gpu, p, mem, prefix_cache, eager)
        proc = ex.launch(die_with_parent=False, append_log=True)
        (RUN_DIR / f"stx-vllm-{p}.pid").write_text(str(proc.pid))
        print(f"vLLM {name} on GPU {gpu}: http://127.0.0.1:{p} (pid {proc.pid})", flush=True)
        ports.append(p)
    return ports


def _alive(pid: int) -> bool:
    """Running, and not a zombie: a child that died under ``start --wait`` is not reaped yet, and
    ``kill(pid, 0)`` alone took such a dead vLLM for a live one until the 480 s timeout."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def wait(ports: Sequence[int], timeout: float = 480.0) -> None:
    """Until every executor lists its model; an executor that dies shows its log's tail."""
    deadline = time.monotonic() + timeout
    pending = list(ports)
    t0 = time.monotonic()
    while pending:
        for p in list(pending):
            pid = int((RUN_DIR / f"stx-vllm-{p}.pid").read_text())
            if not _alive(pid):
                tail = (RUN_DIR / f"stx-vllm-{p}.log").read_text(errors="replace")[-4000:]
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
    for p in ports:
        pid_file = RUN_DIR / f"stx-vllm-{p}.pid"
        if not pid_file.is_file():
            continue
        pid = int(pid_file.read_text())
        if _alive(pid):
            os.killpg(pid, signal.SIGTERM)
            for _ in range(60):
                if not _alive(pid):
                    break
                time.sleep(0.5)
            else:
                os.killpg(pid, signal.SIGKILL)
        pid_file.unlink()
        print(f"stopped vLLM on port {p}", flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--model", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--gpus", required=True, help="Comma-separated GPU indices, one executor each.")
    s.add_argument("--port", type=int, required=True, help="Port of the first executor.")
    s.add_argument("--mem", type=float, default=0.3, help="--gpu-memory-utilization of each.")
    s.add_argument("--no-prefix-cache", action="store_true", help="Turn vLLM's prefix caching off.")
    s.add_argument("--eager", action="store_true", help="No CUDA graphs / torch.compile: starts sooner, runs slower.")
    s.add_argument("--wait", action="store_true", help="Wait until all are ready.")
    for name in ("wait", "stop"):
        p = sub.add_parser(name)
        p.add_argument("--ports", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "start":
        ports = start(a.model, a.name, a.gpus.split(","), a.port, a.mem, not a.no_prefix_cache, a.eager)
        if a.wait:
            wait(ports)
    elif a.cmd == "wait":
        wait(_ints(a.ports))
    else:
        stop(_ints(a.ports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

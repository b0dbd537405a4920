"""Start a stock vLLM OpenAI-compatible server on chosen GPUs of this node, on 127.0.0.1.

The GPU build of :class:`~services.executor_vllm.vllm_server.VllmExecutor`, beside the CPU one of
:mod:`services.executor_vllm.cpu_launcher` (the process handling is the base's: a session of its own,
``start()`` waits for ``/v1/models``, ``stop()`` ends its process group). The trainer's loop and the GPU
benchmarks start executors only through these two classes.

- ``CUDA_VISIBLE_DEVICES`` pins the server to its GPUs (one GPU unless ``tensor_parallel_size`` > 1);
- ``gpu_memory_utilization`` is the share of each GPU it may take (lower it when a trainer shares the GPU);
- NVLink multicast stays off (``NCCL_NVLS_ENABLE=0`` and friends): on shared hosts a program that uses
  it can take every GPU of the host out of service;
- ``VLLM_USE_FLASHINFER_SAMPLER=0``: air-gapped installs carry no flashinfer (docs/airgap.md);
  vLLM then samples with torch.

    python -m services.executor_vllm.gpu_launcher --model DIR --gpus 1 --port 8001   # until Ctrl-C
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import typer

from services.executor_vllm.vllm_server import DEFAULT_SERVED_NAME, VllmExecutor, serve_until_stopped
from shared.wire import EXECUTOR_PORT

# Never NVLink multicast (SHARP) on shared hosts; child processes inherit these.
SAFE_GPU_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
GPU_VLLM_ENV: dict[str, str] = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}


def gpu_env(gpus: Sequence[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a GPU executor on ``gpus``; the multicast switches always win."""
    if not gpus:
        raise ValueError("gpus: a GPU executor needs at least one GPU")
    env = dict(os.environ if base is None else base)
    for key, value in GPU_VLLM_ENV.items():
        env.setdefault(key, value)
    env.update(SAFE_GPU_ENV)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


# CUDA graphs of the decode steps, captured without torch.compile (vLLM's compilation mode NONE): the
# capture takes seconds where compiling takes a minute or more, and a small model's decode step, bound by
# kernel launches when eager, runs as one graph replay.
GRAPHS_WITHOUT_COMPILE = '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'


class GpuExecutor(VllmExecutor):
    """A vLLM server on ``gpus`` (bf16, CUDA graphs unless ``enforce_eager``, compiled unless ``compile_graphs``
    is False, prefix caching unless ``prefix_caching`` is False)."""

    def __init__(
        self,
        model: str | Path,
        gpus: Sequence[str | int],
        served_model_name: str = DEFAULT_SERVED_NAME,
        port: int | None = None,
        gpu_memory_utilization: float = 0.85,
        log_path: str | Path | None = None,
        max_model_len: int = 4096,
        seed: int = 0,
        enforce_eager: bool = False,
        extra_args: Sequence[str] = (),
        prefix_caching: bool = True,
        extra_env: Mapping[str, str] | None = None,
        compile_graphs: bool = True,
    ) -> None:
        super().__init__(
            model, served_model_name, port, log_path=log_path, max_model_len=max_model_len, seed=seed,
            extra_args=extra_args, extra_env=extra_env,
        )  # fmt: skip
        self.gpus = [str(g) for g in gpus]
        if not self.gpus or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"gpus: need distinct GPU ids, got {self.gpus}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enforce_eager = enforce_eager
        self.compile_graphs = compile_graphs
        self.prefix_caching = prefix_caching

    def command(self) -> list[str]:
        cmd = [
            *self.server_argv(),
            "--dtype", "bfloat16", "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
            "--gpu-memory-utilization", str(self.gpu_memory_utilization),
            "--tensor-parallel-size", str(len(self.gpus)),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        elif not self.compile_graphs:
            cmd += ["--compilation-config", GRAPHS_WITHOUT_COMPILE]
        return cmd + self.extra_args

    def env(self) -> dict[str, str]:
        return gpu_env(self.gpus)


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def serve(
    model: Path = typer.Option(..., exists=True, file_okay=False, help="HF model directory."),
    gpus: str = typer.Option("0", help="Comma-separated GPU ids (CUDA_VISIBLE_DEVICES of the server)."),
    served_model_name: str = typer.Option(DEFAULT_SERVED_NAME, help="Name clients use in requests."),
    port: int = typer.Option(EXECUTOR_PORT, help="Port on 127.0.0.1 (shared.wire.EXECUTOR_PORT)."),
    gpu_memory_utilization: float = typer.Option(0.85, help="Share of each GPU the server may take."),
    max_model_len: int = typer.Option(4096, help="Context length."),
    timeout: float = typer.Option(900.0, help="Seconds to wait for the model to be listed."),
) -> None:
    """Serve until interrupted; stops the server's whole process tree on exit."""
    ex = GpuExecutor(
        model, gpus.split(","), served_model_name, port, gpu_memory_utilization, max_model_len=max_model_len
    )
    serve_until_stopped(ex, timeout, f"vLLM on GPU {gpus}: {ex.url}")


if __name__ == "__main__":
    app()

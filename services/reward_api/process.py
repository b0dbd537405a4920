"""Run the reward service as a child process on 127.0.0.1: the demo, the training loop, the GRPO
smoke, the benchmarks and the tests all start it this way (``python -m services.reward_api``), an
owned child of :mod:`services.child_process` (a session of its own; it ends with its starter)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from services.child_process import spawn, stop_group
from services.executor_vllm.vllm_server import free_port

REPO = Path(__file__).resolve().parents[2]


class RewardApiProcess:
    """``python -m services.reward_api`` with the given environment (its settings), in its own process
    group so that ``stop()`` ends exactly its tree (uvicorn workers included).

    The service runs from ``cwd`` (this checkout unless told otherwise), first on ``PYTHONPATH``; the
    inherited entries stay after it (an air-gapped GPU node keeps its wheels there)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        port: int | None = None,
        workers: int = 1,
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.port = port or free_port()
        # Another checkout's code (``python -m`` imports from the working directory first): the benches
        # measure an earlier commit's service beside this one.
        self.cwd = Path(cwd) if cwd else REPO
        self.workers = workers
        self.env = {**os.environ, **(env or {})}
        inherited = self.env.get("PYTHONPATH", "")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.cwd), inherited) if p)
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/stx-reward-api-{self.port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 120.0) -> RewardApiProcess:
        """Start and wait until ``/healthz`` answers; the error carries the log's tail."""
        cmd = [sys.executable, "-m", "services.reward_api", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--workers", str(self.workers)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = spawn(cmd, env=self.env, stdout=log, cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reward_api exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"reward_api not healthy within {timeout} s:\n{self._log_tail()}")

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("reward_api is not running")
        return self.proc.pid

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after 20 s."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc, 20)

    def __enter__(self) -> RewardApiProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

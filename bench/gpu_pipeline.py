"""Hook: benchmark 2 (pipeline reward vs executor ceiling vs sequential loop) against a GPU vLLM.

Not run by ``python -m bench all`` (there is no GPU here). On a GPU machine, serve the frozen π2 (or
SmolLM2 for a like-for-like check) with stock vLLM, then point this at it:

    vllm serve /models/pi2 --served-model-name pi2 --port 8001 &
    python -m bench gpu-pipeline --executor-url http://127.0.0.1:8001 --model pi2 [--items 512]

It starts a local reward_api (cache off, MAX_IN_FLIGHT 256) against that URL and writes
``bench/results/gpu_pipeline.{json,md}`` with the same goals: ≥ 0.9× the ceiling, ≥ 10× the loop
(binding here; informational on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import pipeline_reward


def run(
    executor_url: str,
    model: str = pipeline_reward.DEFAULT_MODEL,
    golden: str | Path | None = None,
    quick: bool = False,
    n_items: int | None = None,
    max_tokens: int | None = 64,
) -> dict[str, Any]:
    """Benchmark 2 on a GPU executor; a GPU batches far more, so more items and a wider in-flight limit."""
    return pipeline_reward.run(
        executor_url,
        golden,
        quick=quick,
        model=model,
        max_tokens=max_tokens,
        n_items=n_items or (64 if quick else 512),
        repeats=1 if quick else 3,
        max_in_flight=256,
        name="gpu_pipeline",
        sequential_binding=True,  # informational only on CPU, where the executor's ceiling bounds it
    )

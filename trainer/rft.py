"""RFT baseline (rejection-sampling fine-tuning), trained and evaluated beside the RL phases.

For every training prompt: sample ``k`` outputs from a served policy (one OpenAI request with
``n=k``), score all of them through the reward API (the same rewards as RL), keep the best one if
its reward is ≥ ``threshold``, and write the kept pairs as an SFT parquet (``messages`` column)
under ``<out>/data/<a1|a2>/train.parquet`` (validation: the gold SFT rows). Training then reuses
the SFT launcher (phase A1 for Stage 1, A2 for Stage 2); the exported model is compared with the
RL policies by ``trainer evaluate pipeline --setting rft=...``.

Stages: ``schema`` (π1, schema reward), ``pipeline`` (π1, pipeline reward via the executor),
``table`` (π2 on gold schemas, table reward).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from shared import (
    GoldenExample,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    gold_ndjson,
    read_golden,
)
from trainer.data.datasets import SFT_SCHEMA, sft_row, write_parquet
from trainer.evaluation.executor_client import ExecutorClient, GenerationConfig

Stage = Literal["schema", "table", "pipeline"]
SFT_PHASE: dict[str, str] = {"schema": "a1", "pipeline": "a1", "table": "a2"}


@dataclass(frozen=True)
class RftConfig:
    k: int = 4
    threshold: float = 0.5
    temperature: float = 1.0
    max_tokens: int = 256
    concurrency: int = 8
    timeout_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [-1, 1], got {self.threshold}")


def prompt_for(stage: Stage, ex: GoldenExample) -> list[dict[str, str]]:
    return build_stage2_messages(ex.text, ex.schema_dict()) if stage == "table" else build_stage1_messages(ex.text)


def reward_item(stage: Stage, ex: GoldenExample, item_id: str, prediction: str) -> dict[str, Any]:
    """One reward_api item (DESIGN §4.4) for a sampled output."""
    if stage == "schema":
        return {"id": item_id, "prediction": prediction, "gold_schema": ex.schema_dict()}
    if stage == "table":
        return {"id": item_id, "prediction": prediction, "gold_table": ex.table_dict()}
    return {
        "id": item_id,
        "prediction": prediction,
        "text": ex.text,
        "gold_schema": ex.schema_dict(),
        "gold_table": ex.table_dict(),
    }


# Items per POST: well under reward_api's per-request item limit (its max_items setting, 4,096 by default).
# A preflight of 200 prompts x 3 sources x 17 samples is 10,200 items: sent whole, it was a 413 on the GPU
# node (issue 23's first A/B lease) and the sweep wrote no report.
SCORE_BATCH = 1024


def score_results(
    reward_url: str,
    stage: Stage,
    items: list[dict[str, Any]],
    timeout_s: float = 600.0,
    batch: int = SCORE_BATCH,
) -> list[dict[str, Any]]:
    """The results of ``items`` in order (reward, valid_json, ...), from ``POST /reward/<stage>`` in batches of
    at most ``batch`` items (errors raise)."""
    results: list[dict[str, Any]] = []
    with httpx.Client(timeout=timeout_s) as client:
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            r = client.post(f"{reward_url.rstrip('/')}/reward/{stage}", json={"items": chunk})
            if r.status_code != 200:
                raise RuntimeError(f"reward_api /reward/{stage} answered {r.status_code}: {r.text[:500]}")
            got: list[dict[str, Any]] = r.json()["results"]
            if [x["id"] for x in got] != [x["id"] for x in chunk]:
                raise RuntimeError("reward_api returned results in a different order or count")
            results += got
    return results


def score(reward_url: str, stage: Stage, items: list[dict[str, Any]], timeout_s: float = 600.0) -> list[float]:
    """Rewards of ``items`` in order, from ``POST /reward/<stage>`` (errors raise, never 0)."""
    return [float(x["reward"]) for x in score_results(reward_url, stage, items, timeout_s)]


@dataclass
class RftReport:
    stage: str
    prompts: int
    samples: int
    kept: int
    mean_best_reward: float
    threshold: float
    train_file: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def select_best(rewards: Sequence[float], threshold: float) -> int | None:
    """Index of the highest reward if it reaches ``threshold`` (first on ties), else None."""
    if not rewards:
        return None
    best = max(range(len(rewards)), key=lambda i: (rewards[i], -i))
    return best if rewards[best] >= threshold else None


def build_rft_data(
    golden: Path,
    out: Path,
    stage: Stage,
    policy_url: str,
    model: str,
    reward_url: str,
    cfg: RftConfig,
    limit: int | None = None,
) -> RftReport:
    """Sample, score, keep the best ≥ threshold; write ``out/data/<a1|a2>/{train,validation}.parquet``."""
    examples = read_golden(golden / "common_train_schemas.jsonl", limit)
    prompts = [prompt_for(stage, ex) for ex in examples]

    gen = GenerationConfig(
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
        timeout_s=cfg.timeout_s,
    )
    samples = asyncio.run(ExecutorClient(policy_url, model, gen).sample(prompts, cfg.k))
    items = [
        reward_item(stage, ex, f"{ex.id}#{j}", s)
        for ex, outs in zip(examples, samples, strict=True)
        for j, s in enumerate(outs)
    ]
    rewards = score(reward_url, stage, items)
    rows: list[dict[str, Any]] = []
    best_rewards: list[float] = []
    pos = 0
    for prompt, outs in zip(prompts, samples, strict=True):
        rs = rewards[pos : pos + len(outs)]
        pos += len(outs)
        idx = select_best(rs, cfg.threshold)
        if rs:
            best_rewards.append(max(rs))
        if idx is not None:
            rows.append({"messages": [*prompt, {"role": "assistant", "content": outs[idx]}]})
    phase = SFT_PHASE[stage]
    train = out / "data" / phase / "train.parquet"
    if not rows:
        raise ValueError(f"RFT kept no sample above threshold {cfg.threshold}: lower --threshold or raise --k")
    write_parquet(rows, train, SFT_SCHEMA)
    val_examples = read_golden(golden / "common_validation_schemas.jsonl", limit)
    write_parquet([sft_row(phase, ex) for ex in val_examples], out / "data" / phase / "validation.parquet", SFT_SCHEMA)
    report = RftReport(
        stage=stage,
        prompts=len(examples),
        samples=len(items),
        kept=len(rows),
        mean_best_reward=round(sum(best_rewards) / max(len(best_rewards), 1), 4),
        threshold=cfg.threshold,
        train_file=str(train),
    )
    (out / "rft_report.json").write_text(json.dumps({**report.as_dict(), "config": asdict(cfg)}, indent=2) + "\n")
    return report


def gold_target(stage: Stage, ex: GoldenExample) -> str:
    """The gold answer of a prompt (used by tests to check the reward path ranks it first)."""
    return gold_ndjson(ex.table_dict()) if stage == "table" else canonical_schema_json(ex.schema_dict())

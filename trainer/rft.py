"""RFT baseline (rejection-sampling fine-tuning), trained and evaluated beside the RL phases.

For every training prompt: sample ``k`` outputs from a served policy (one OpenAI request with
``n=k``), score all of them through the reward API (the same rewards as RL), keep the best one if
its reward is ≥ ``threshold``, and write the kept pairs as an SFT parquet (``messages`` column)
under ``<out>/data/<a1|a2>/train.parquet`` (validation: the gold SFT rows). Training then reuses
the SFT launcher (phase A1 for Stage 1, A2 for Stage 2); the exported model is compared with the
RL policies by ``trainer evaluate pipeline --setting rft=...``.

Rewards (the reward kinds of :mod:`trainer.phases.registry`): ``schema`` (π1, schema reward), ``pipeline``
(π1, pipeline reward via the executor), ``table`` (π2 on gold schemas, table reward).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shared import read_golden
from trainer.data.datasets import SFT_SCHEMA, sft_row, write_parquet
from trainer.evaluation.generation import GenerationClient, GenerationConfig, truncated
from trainer.evaluation.reward_scoring import prompt_for, reward_item, score
from trainer.phases.registry import RewardKind, sft_phase_for


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


@dataclass
class RftReport:
    reward: str
    prompts: int
    samples: int
    kept: int
    mean_best_reward: float
    threshold: float
    train_file: str
    truncated: int = 0  # samples cut at max_tokens: never kept (a cut answer is no demonstration)
    prompts_all_cut: int = 0  # prompts none of whose samples ended before max_tokens

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
    reward: RewardKind,
    policy_url: str,
    model: str,
    reward_url: str,
    cfg: RftConfig,
    limit: int | None = None,
) -> RftReport:
    """Sample, score, keep the best ≥ threshold; write ``out/data/<a1|a2>/{train,validation}.parquet``."""
    examples = read_golden(golden / "common_train_schemas.jsonl", limit)
    prompts = [prompt_for(reward, ex) for ex in examples]

    gen = GenerationConfig(
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
        timeout_s=cfg.timeout_s,
    )
    samples = asyncio.run(GenerationClient(policy_url, model, gen).sample(prompts, cfg.k))
    items = [
        reward_item(reward, ex, f"{ex.id}#{j}", s)
        for ex, outs in zip(examples, samples, strict=True)
        for j, s in enumerate(outs)
    ]
    rewards = score(reward_url, reward, items)
    rows: list[dict[str, Any]] = []
    best_rewards: list[float] = []
    pos = cut = all_cut = 0
    for prompt, outs in zip(prompts, samples, strict=True):
        rs = rewards[pos : pos + len(outs)]
        pos += len(outs)
        whole = [j for j, o in enumerate(outs) if not truncated(o)]  # a cut answer is no demonstration
        cut += len(outs) - len(whole)
        all_cut += not whole
        best = select_best([rs[j] for j in whole], cfg.threshold)
        idx = whole[best] if best is not None else None
        if rs:
            best_rewards.append(max(rs))
        if idx is not None:
            rows.append({"messages": [*prompt, {"role": "assistant", "content": outs[idx]}]})
    phase = sft_phase_for(reward)
    train = out / "data" / phase / "train.parquet"
    if not rows:
        why = f" ({cut} of {len(items)} samples were cut at max_tokens {cfg.max_tokens})" if cut else ""
        raise ValueError(
            f"RFT kept no sample above threshold {cfg.threshold}{why}: lower --threshold, raise --k or --max-tokens"
        )
    write_parquet(rows, train, SFT_SCHEMA)
    val_examples = read_golden(golden / "common_validation_schemas.jsonl", limit)
    write_parquet([sft_row(phase, ex) for ex in val_examples], out / "data" / phase / "validation.parquet", SFT_SCHEMA)
    report = RftReport(
        reward=reward,
        prompts=len(examples),
        samples=len(items),
        kept=len(rows),
        mean_best_reward=round(sum(best_rewards) / max(len(best_rewards), 1), 4),
        threshold=cfg.threshold,
        train_file=str(train),
        truncated=cut,
        prompts_all_cut=all_cut,
    )
    (out / "rft_report.json").write_text(json.dumps({**report.as_dict(), "config": asdict(cfg)}, indent=2) + "\n")
    return report

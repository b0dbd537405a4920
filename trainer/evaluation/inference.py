"""Stage-1 / Stage-2 inference and C2 schema precomputation against an executor URL."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from shared import PROMPT_VERSION, GoldenExample, build_stage1_messages, build_stage2_messages, read_golden
from trainer.data.datasets import RL_SCHEMA, rl_row, update_manifest, write_parquet
from trainer.data.prompt_fit import Stage2Fit
from trainer.evaluation.executor_client import (
    ExecutorClient,
    GenerationConfig,
    Message,
    generate_with_progress,
    messages_hash,
)
from trainer.evaluation.two_stage import PromptStage, stage2_on_prediction

Stage = PromptStage

T = TypeVar("T")


def stage_messages(stage: Stage, ex: GoldenExample) -> list[Message]:
    """Stage 1 from the document; Stage 2 from the document and the *gold* schema."""
    if stage == "stage1":
        return build_stage1_messages(ex.text)
    return build_stage2_messages(ex.text, ex.schema_dict())


def infer(
    stage: Stage, examples: Sequence[GoldenExample], client: ExecutorClient, out: Path | None = None
) -> list[dict[str, Any]]:
    """Predictions for ``examples``: id, stage, prediction, messages_sha256, model, prompt_version."""
    prompts = [stage_messages(stage, ex) for ex in examples]
    outputs = asyncio.run(generate_with_progress(client, prompts, stage))
    records = [
        {
            "id": ex.id,
            "stage": stage,
            "prediction": text,
            "messages_sha256": messages_hash(msgs),
            "model": client.model,
            "prompt_version": PROMPT_VERSION,
        }
        for ex, msgs, text in zip(examples, prompts, outputs, strict=True)
    ]
    if out is not None:
        write_jsonl(out, records)
    return records


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON: {exc}") from None
    return out


@dataclass
class PrecomputeReport:
    """Per split: rows written, invalid predicted schemas (skipped or replaced by gold)."""

    counts: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    invalid_ids: dict[str, list[str]] = field(default_factory=dict)
    too_long_ids: dict[str, list[str]] = field(default_factory=dict)  # Stage-2 prompt past the context: dropped


def seeded_sample(items: Sequence[T], n: int, seed: int) -> list[T]:
    """``n`` of ``items`` drawn at random with ``seed``, kept in their original order (all if fewer)."""
    if n >= len(items):
        return list(items)
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]


def precompute_c2(
    golden: Path,
    out: Path,
    client: ExecutorClient,
    splits: Sequence[str] = ("train", "validation"),
    on_invalid: Literal["skip", "gold"] = "skip",
    limit: int | None = None,
    stage2_fit: Stage2Fit | None = None,
    sample: Mapping[str, int] | None = None,
    seed: int = 0,
) -> PrecomputeReport:
    """Run π1 over the splits and write ``out/c2/<split>.parquet``: Stage-2 prompts on the *predicted*
    schema, ground truth = gold table. Invalid schemas are counted, then skipped or given the gold one.
    With ``stage2_fit``, rows whose Stage-2 prompt cannot fit that context are counted and dropped.
    ``sample`` (split → n): a seeded random n documents of that split, in file order (all if it has fewer)."""
    if sample:
        unknown = sorted(set(sample) - set(splits))
        if unknown:
            raise ValueError(f"sample: splits {unknown} are not among {list(splits)}")
        bad_n = {k: n for k, n in sample.items() if n < 1}
        if bad_n:
            raise ValueError(f"sample: sizes must be >= 1, got {bad_n}")
    report = PrecomputeReport()
    sources = []
    for split in splits:
        src = golden / f"common_{split}_schemas.jsonl"
        if not src.is_file():
            raise FileNotFoundError(f"--golden: {src} is missing")
        sources.append(src)
        examples = read_golden(src, limit)
        if sample and split in sample:
            examples = seeded_sample(examples, sample[split], seed)
        schemas = asyncio.run(
            generate_with_progress(client, [build_stage1_messages(ex.text) for ex in examples], f"π1 {split}")
        )
        rows: list[dict[str, Any]] = []
        bad: list[str] = []
        for ex, schema_text in zip(examples, schemas, strict=True):
            prompt = stage2_on_prediction(ex.text, schema_text)
            if prompt is None:
                bad.append(ex.id)
                if on_invalid == "skip":
                    continue
                prompt = build_stage2_messages(ex.text, ex.schema_dict())
            if stage2_fit is not None and not stage2_fit.fits(prompt):
                report.too_long_ids.setdefault(split, []).append(ex.id)
                continue
            rows.append(rl_row("c2", ex, len(rows), split, prompt=prompt))
        report.counts[split] = write_parquet(rows, out / "c2" / f"{split}.parquet", RL_SCHEMA)
        report.invalid[split] = len(bad)
        report.invalid_ids[split] = bad
    c2: dict[str, Any] = {
        "schema_model": client.model, "on_invalid": on_invalid, "invalid_schemas": report.invalid, "limit": limit,
        "sample": dict(sample or {}), "seed": seed,
    }  # fmt: skip
    if stage2_fit is not None:
        c2 |= stage2_fit.describe()
        c2["stage2_too_long"] = {k: len(v) for k, v in report.too_long_ids.items()}
        c2["stage2_too_long_ids"] = report.too_long_ids
    update_manifest(out, {"c2": report.counts}, sources, c2=c2)
    return report


def generation_config(max_tokens: int, concurrency: int, timeout_s: float, seed: int = 0) -> GenerationConfig:
    return GenerationConfig(max_tokens=max_tokens, concurrency=concurrency, timeout_s=timeout_s, seed=seed)

"""C2's training data: Stage-2 prompts on the schemas π1 predicted (``trainer data precompute-schemas``).

The phase registry gives C2 the prompt ``stage2_predicted``: its rows need π1's schemas, which only a served
model can write. This module builds the rows from those predictions; the caller passes the predictor
(``predict_schemas``: a split's documents → π1's schema texts, e.g.
:func:`trainer.evaluation.inference.schema_predictor` over a served π1), so the data builders never talk to
an executor. Invalid predicted schemas are counted, then skipped or replaced by the gold schema. A schema cut
at the token limit is counted apart (``truncated``: a configuration fault, not π1's mistake), goes the way of
the invalid ones, and past ``max_truncated_share`` of a split the precompute fails, naming the count.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from shared import GoldenExample, build_stage2_messages
from shared.golden import source_of
from trainer.data.datasets import RL_SCHEMA, read_splits, rl_row, update_manifest, write_parquet
from trainer.data.prompt_fit import Stage2Fit
from trainer.evaluation.generation import check_truncated, truncated
from trainer.evaluation.two_stage import stage2_on_prediction

T = TypeVar("T")
# A split's documents (and the split's name, for progress) → π1's schema texts, one per document, in order.
SchemaPredictor = Callable[[Sequence[GoldenExample], str], Sequence[str]]


@dataclass
class PrecomputeReport:
    """Per split: rows written, invalid predicted schemas (skipped or replaced by gold)."""

    counts: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    invalid_ids: dict[str, list[str]] = field(default_factory=dict)
    too_long_ids: dict[str, list[str]] = field(default_factory=dict)  # Stage-2 prompt past the context: dropped
    truncated_ids: dict[str, list[str]] = field(default_factory=dict)  # π1's schema cut at its max tokens


def seeded_sample(items: Sequence[T], n: int, seed: int) -> list[T]:
    """``n`` of ``items`` drawn at random with ``seed``, kept in their original order (all if fewer)."""
    if n >= len(items):
        return list(items)
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]


def of_sources(examples: Sequence[GoldenExample], sources: Sequence[str], what: str) -> list[GoldenExample]:
    """The examples of ``sources`` (``shared.golden.source_of`` of their ids); raises naming ``what`` and the
    sources present when one of them has no example."""
    present = {source_of(ex.id) for ex in examples}
    missing = sorted(set(sources) - present)
    if missing:
        raise ValueError(f"{what}: no document of source(s) {missing} (the split has {sorted(present)})")
    return [ex for ex in examples if source_of(ex.id) in sources]


def precompute_c2(
    golden: Path,
    out: Path,
    predict_schemas: SchemaPredictor,
    schema_model: str,
    splits: Sequence[str] = ("train", "validation"),
    on_invalid: Literal["skip", "gold"] = "skip",
    limit: int | None = None,
    stage2_fit: Stage2Fit | None = None,
    sample: Mapping[str, int] | None = None,
    seed: int = 0,
    sources: Mapping[str, Sequence[str]] | None = None,
    max_truncated_share: float = 0.02,
) -> PrecomputeReport:
    """π1's schemas for each split (``predict_schemas``; ``schema_model`` names π1 in the manifest), then
    ``out/c2/<split>.parquet``: Stage-2 prompts on the *predicted* schema, ground truth = gold table. Invalid
    schemas are counted, then skipped or given the gold one.
    With ``stage2_fit``, rows whose Stage-2 prompt cannot fit that context are counted and dropped.
    ``sample`` (split → n): a seeded random n documents of that split, in file order (all if it has fewer).
    ``sources`` (split → data sources): only those sources' documents of that split, before sampling (C2
    trained where the headroom is); a source with no document there is an error naming it.
    The train documents that repeat a validation or test document are left out (``dropped_train`` in the
    manifest's ``c2``), as ``data build`` leaves them out."""
    _check_per_split(splits, sample, sources)
    report = PrecomputeReport()
    files = []
    read, overlap = read_splits(golden, splits, limit)  # train rows that repeat a held-out document left out
    for split in splits:
        files.append(golden / f"common_{split}_schemas.jsonl")
        examples = read[split]
        if sources and split in sources:
            examples = of_sources(examples, sources[split], f"sources[{split!r}]")
        if sample and split in sample:
            examples = seeded_sample(examples, sample[split], seed)
        schemas = predict_schemas(examples, split)
        if len(schemas) != len(examples):
            raise ValueError(f"{split}: {len(schemas)} predicted schemas for {len(examples)} documents")
        cut = [ex.id for ex, schema_text in zip(examples, schemas, strict=True) if truncated(schema_text)]
        report.truncated_ids[split] = cut
        check_truncated(f"C2 precompute, {split}: π1 schemas", len(cut), len(examples), None, max_truncated_share)
        rows, bad = _c2_rows(split, examples, schemas, on_invalid, stage2_fit, report)
        report.counts[split] = write_parquet(rows, out / "c2" / f"{split}.parquet", RL_SCHEMA)
        report.invalid[split] = len(bad)
        report.invalid_ids[split] = bad
    c2: dict[str, Any] = {
        "schema_model": schema_model, "on_invalid": on_invalid, "invalid_schemas": report.invalid,
        "truncated_schemas": {k: len(v) for k, v in report.truncated_ids.items()}, "limit": limit,
        "sample": dict(sample or {}), "seed": seed, "sources": {k: list(v) for k, v in (sources or {}).items()},
        "dropped_train": overlap.train_drop if overlap is not None else [],
    }  # fmt: skip
    if stage2_fit is not None:
        c2 |= stage2_fit.describe()
        c2["stage2_too_long"] = {k: len(v) for k, v in report.too_long_ids.items()}
        c2["stage2_too_long_ids"] = report.too_long_ids
    update_manifest(out, {"c2": report.counts}, files, c2=c2)
    return report


def _check_per_split(
    splits: Sequence[str], sample: Mapping[str, int] | None, sources: Mapping[str, Sequence[str]] | None
) -> None:
    """``sample`` and ``sources`` name only ``splits``, and every sample size is at least 1."""
    for name, keyed in (("sample", sample), ("sources", sources)):
        unknown = sorted(set(keyed or {}) - set(splits))
        if unknown:
            raise ValueError(f"{name}: splits {unknown} are not among {list(splits)}")
    if sample:
        bad_n = {k: n for k, n in sample.items() if n < 1}
        if bad_n:
            raise ValueError(f"sample: sizes must be >= 1, got {bad_n}")


def _c2_rows(
    split: str,
    examples: Sequence[GoldenExample],
    schemas: Sequence[str],
    on_invalid: Literal["skip", "gold"],
    stage2_fit: Stage2Fit | None,
    report: PrecomputeReport,
) -> tuple[list[dict[str, Any]], list[str]]:
    """A split's C2 rows (Stage-2 prompts on π1's schemas; an invalid or cut one skipped or given the gold schema,
    a prompt past ``stage2_fit`` dropped and named in ``report``) and the ids of its invalid schemas."""
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for ex, schema_text in zip(examples, schemas, strict=True):
        prompt = None if truncated(schema_text) else stage2_on_prediction(ex.text, schema_text)
        if prompt is None:
            if not truncated(schema_text):
                bad.append(ex.id)
            if on_invalid == "skip":
                continue
            prompt = build_stage2_messages(ex.text, ex.schema_dict())
        if stage2_fit is not None and not stage2_fit.fits(prompt):
            report.too_long_ids.setdefault(split, []).append(ex.id)
            continue
        rows.append(rl_row("c2", ex, len(rows), split, prompt=prompt))
    return rows, bad

"""Training data for every phase, built from golden JSONL with the prompt builders of ``shared``.

What a phase's rows hold (its prompt, what its reward checks, its reward kind) is the phase registry's
(:mod:`trainer.registry.phases`); this module only writes it.

Layout under ``--out``: ``<phase>/<split>.parquet`` (phases a1, a2, b1, b2, c1, c2; splits train and
validation) plus ``manifest.json`` (counts, prompt version, source files with sha256, ``split_overlap``).

No document is trained on and evaluated on (:mod:`shared.split_overlap`): every split file must hold examples,
and the train rows that share an id or a text (whitespace collapsed, casefolded) with a validation or test
document are dropped, counted and named in the manifest (``split_overlap``); with ``strict_splits`` any overlap
between splits is refused instead. Validation and test are never changed.

- SFT (A1, A2): ``messages`` (system, user, assistant) for VERL's ``sft_trainer``, and the golden ``id``
  (VERL reads only ``messages``; the SFT length filter names the rows it drops by it).
- RL (B1, B2, C1, C2): VERL's RLHFDataset columns ``prompt``, ``data_source``, ``ability``,
  ``reward_model`` {style, ground_truth}, ``extra_info`` {id, phase, prompt_version, index, split}.
  ``data_source`` is ``<reward kind>:<golden source>`` (``table:wikitabletext``, :mod:`trainer.registry.data_source`),
  so VERL reports every validation metric per source.
  ``ground_truth`` is a JSON *string*: gold tables hold ragged, nullable lists that Arrow would
  coerce, so the reward function decodes it (see :func:`trainer.in_verl.reward_batcher.decode_ground_truth`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shared import (
    PROMPT_VERSION,
    GoldenExample,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    gold_ndjson,
    golden_filename,
    read_golden,
)
from shared.golden import SPLITS, EmptySplitError, sha256_file
from shared.split_overlap import SplitOverlap, check_not_empty, check_splits, find_overlaps
from trainer.data.prompt_fit import PhaseLengths, Stage2Fit
from trainer.data.sft_mix import SourceMix
from trainer.registry.data_source import data_source
from trainer.registry.phases import ABILITY, BUILD_PHASES, PHASES, SFT_PHASES, Phase, get_phase

TRAIN_SPLITS = ("train", "validation")

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SFT_SCHEMA = pa.schema([("messages", pa.list_(_MESSAGE)), ("id", pa.string())])
RL_SCHEMA = pa.schema(
    [
        ("prompt", pa.list_(_MESSAGE)),
        ("data_source", pa.string()),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("id", pa.string()),
                    ("phase", pa.string()),
                    ("prompt_version", pa.string()),
                    ("index", pa.int64()),
                    ("split", pa.string()),
                ]
            ),
        ),
    ]
)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=False)


def golden_prompt(phase: Phase, ex: GoldenExample) -> list[dict[str, str]]:
    """The phase's prompt (the registry's ``prompt``) built from the golden example alone."""
    if phase.prompt == "stage1":
        return build_stage1_messages(ex.text)
    if phase.prompt == "stage2_gold":
        return build_stage2_messages(ex.text, ex.schema_dict())
    raise ValueError(f"phase {phase.name!r} needs an explicit prompt (Stage 2 on π1's predicted schema)")


def sft_row(phase: str, ex: GoldenExample) -> dict[str, Any]:
    """A1: Stage-1 prompt → canonical gold schema. A2: Stage-2 prompt on the gold schema → gold NDJSON."""
    ph = get_phase(phase)
    if ph.kind != "sft":
        raise ValueError(f"phase must be one of {list(SFT_PHASES)}, got {phase!r}")
    target = canonical_schema_json(ex.schema_dict()) if ph.policy == "pi1" else gold_ndjson(ex.table_dict())
    return {"messages": [*golden_prompt(ph, ex), {"role": "assistant", "content": target}], "id": ex.id}


def ground_truth(phase: str, ex: GoldenExample) -> dict[str, Any]:
    """What the reward needs (the registry's ``ground_truth``): B1 the schema, B2/C2 the table, C1 schema +
    table + document."""
    ph = get_phase(phase)
    if ph.kind != "grpo":
        raise ValueError(f"phase must be a GRPO phase, got {phase!r}")
    known: dict[str, Any] = {"schema": ex.schema_dict(), "table": ex.table_dict(), "text": ex.text}
    return {key: known[key] for key in ph.ground_truth}


def rl_row(
    phase: str, ex: GoldenExample, index: int, split: str, prompt: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """One RLHFDataset row; ``prompt`` overrides the phase's default (C2: the predicted schema)."""
    ph = get_phase(phase)
    if prompt is None:
        prompt = golden_prompt(ph, ex)
    if ph.reward is None:
        raise ValueError(f"phase {phase!r} trains on no reward: an SFT phase has no RL rows")
    return {
        "prompt": prompt,
        "data_source": data_source(ph.reward, ex.id),
        "ability": ABILITY[ph.policy],
        "reward_model": {"style": "rule", "ground_truth": _dumps(ground_truth(phase, ex))},
        "extra_info": {"id": ex.id, "phase": phase, "prompt_version": PROMPT_VERSION, "index": index, "split": split},
    }


def write_parquet(rows: Sequence[dict[str, Any]], path: Path, schema: pa.Schema) -> int:
    """Write rows with an explicit Arrow schema (so empty files still carry the columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), path)
    return len(rows)


def update_manifest(
    out: Path,
    phase_counts: dict[str, dict[str, int]],
    sources: Iterable[Path],
    split_overlap: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """Merge counts into ``out/manifest.json`` (C2 is added later by ``precompute-schemas``); ``split_overlap``
    (what :func:`read_splits` found) replaces the recorded one where given."""
    path = out / "manifest.json"
    manifest: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"phases": {}, "sources": {}}
    manifest["prompt_version"] = PROMPT_VERSION
    if split_overlap is not None:
        manifest["split_overlap"] = split_overlap
    manifest["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for phase, counts in phase_counts.items():
        manifest["phases"][phase] = {
            "counts": counts,
            "files": {s: f"{phase}/{s}.parquet" for s in counts},
            "kind": "sft" if phase in SFT_PHASES else "rl",
            **({"data_source": PHASES[phase].reward} if PHASES[phase].reward else {}),
            **extra.get(phase, {}),
        }
    for src in sources:
        manifest["sources"][str(src.resolve())] = sha256_file(src)
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return path


def read_splits(
    golden: Path, splits: Sequence[str], limit: int | None = None, strict_splits: bool = False
) -> tuple[dict[str, list[GoldenExample]], SplitOverlap | None]:
    """The examples of ``splits`` (the first ``limit`` of each) with the train rows that repeat a validation or
    test document dropped, and what :func:`shared.split_overlap.find_overlaps` found (None when train is not among
    ``splits``). Every split file must exist and hold an example; validation and test are read whole for the check.
    With ``strict_splits``, splits that share a document are refused (``SplitOverlapError``, naming the ids)."""
    check_not_empty(golden)
    path = {s: golden / golden_filename(s) for s in SPLITS}
    if "train" not in splits:
        return {s: read_golden(path[s], limit) for s in splits}, None
    full = {s: read_golden(path[s], limit if s == "train" else None) for s in SPLITS}
    report = check_splits(find_overlaps(full), strict_splits)
    drop = set(report.train_drop)
    out = {s: full[s][:limit] if limit is not None else full[s] for s in splits}
    out["train"] = [ex for ex in full["train"] if ex.id not in drop]
    if not out["train"]:
        raise EmptySplitError(f"{path['train']}: every train row repeats a validation or test document")
    return out, report


def build_datasets(
    golden: Path,
    out: Path,
    phases: Sequence[str] = BUILD_PHASES,
    splits: Sequence[str] = TRAIN_SPLITS,
    limit: int | None = None,
    stage2_fit: Stage2Fit | None = None,
    sft_mix: SourceMix | None = None,
    lengths: PhaseLengths | None = None,
    strict_splits: bool = False,
) -> dict[str, dict[str, int]]:
    """Write the parquet files of ``phases`` for ``splits``; returns counts per phase and split.

    The train rows that repeat a validation or test document are left out and named in the manifest
    (``split_overlap``); with ``strict_splits`` such an overlap is refused (:func:`read_splits`).

    With ``stage2_fit``, C1 drops documents whose Stage-2 prompt (on the gold schema) cannot fit the
    executor's context; their number and ids go to the manifest (``c1.stage2_too_long``).
    With ``sft_mix``, the SFT phases' train split is reweighted by source (:mod:`trainer.data.sft_mix`);
    the mix and the counts per source go to the manifest (``a1.sft_mix``, ``a2.sft_mix``).
    With ``lengths``, the rows over a phase's length limit (RL prompts, SFT conversations) are counted and
    named per split in the manifest (``<phase>.too_long``) and kept: the phase's length filter drops them."""
    bad = [p for p in phases if p not in BUILD_PHASES]
    if bad:
        raise ValueError(f"--phases: unknown {bad}; choose from {list(BUILD_PHASES)} (c2: precompute-schemas)")
    counts: dict[str, dict[str, int]] = {p: {} for p in phases}
    too_long: dict[str, list[str]] = {}
    over_limit: dict[str, dict[str, dict[str, Any]]] = {}
    mixed: dict[str, Any] = {}
    read, overlap = read_splits(golden, splits, limit, strict_splits)
    sources = [golden / golden_filename(s) for s in (SPLITS if overlap is not None else splits)]
    for split in splits:
        examples = read[split]
        sft_examples = examples
        if sft_mix is not None and split == "train" and any(p in SFT_PHASES for p in phases):
            sft_examples = sft_mix.apply(examples)
            mixed = sft_mix.describe(examples, sft_examples)
        for phase in phases:
            counts[phase][split], found = _write_phase_split(
                out, phase, split, examples, sft_examples, stage2_fit, lengths, too_long
            )
            if found is not None:
                over_limit.setdefault(phase, {})[split] = found
    extra = _phase_records(phases, limit, mixed, stage2_fit, too_long, lengths, over_limit)
    recorded = overlap.as_dict(strict_splits) | {"limit": limit} if overlap is not None else None
    update_manifest(out, counts, sources, split_overlap=recorded, **extra)
    return counts


def _write_phase_split(
    out: Path,
    phase: str,
    split: str,
    examples: Sequence[GoldenExample],
    sft_examples: Sequence[GoldenExample],
    stage2_fit: Stage2Fit | None,
    lengths: PhaseLengths | None,
    too_long: dict[str, list[str]],
) -> tuple[int, dict[str, Any] | None]:
    """``out/<phase>/<split>.parquet`` (an SFT phase from ``sft_examples``, an RL one from ``examples``, C1 without
    the documents whose Stage-2 prompt cannot fit, named in ``too_long``): its row count, and its rows over the
    phase's length limit where ``lengths`` is given."""
    if phase in SFT_PHASES:
        rows = [sft_row(phase, ex) for ex in sft_examples]
        count = write_parquet(rows, out / phase / f"{split}.parquet", SFT_SCHEMA)
        return count, lengths.over("sft", [r["messages"] for r in rows], [r["id"] for r in rows]) if lengths else None
    kept = examples
    if phase == "c1" and stage2_fit is not None:
        kept = [ex for ex in examples if stage2_fit.fits(build_stage2_messages(ex.text, ex.schema_dict()))]
        too_long[split] = sorted({ex.id for ex in examples} - {ex.id for ex in kept})
    rows = [rl_row(phase, ex, i, split) for i, ex in enumerate(kept)]
    count = write_parquet(rows, out / phase / f"{split}.parquet", RL_SCHEMA)
    return count, lengths.over("rl", [r["prompt"] for r in rows], [ex.id for ex in kept]) if lengths else None


def _phase_records(
    phases: Sequence[str],
    limit: int | None,
    mixed: dict[str, Any],
    stage2_fit: Stage2Fit | None,
    too_long: dict[str, list[str]],
    lengths: PhaseLengths | None,
    over_limit: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """Each phase's manifest entry beside its counts: the limit, the SFT mix, C1's Stage-2 fit, the rows over the
    phase's length limit."""
    extra: dict[str, Any] = {p: {"limit": limit} for p in phases}
    for phase in SFT_PHASES:
        if phase in extra:
            extra[phase]["sft_mix"] = mixed or None
    if "c1" in extra and stage2_fit is not None:
        extra["c1"] |= {**stage2_fit.describe(), "stage2_too_long": {k: len(v) for k, v in too_long.items()}}
        extra["c1"]["stage2_too_long_ids"] = too_long
    if lengths is not None:
        for phase, per_split in over_limit.items():
            key, value = lengths.limit("sft" if phase in SFT_PHASES else "rl")
            extra[phase]["too_long"] = {
                "tokenizer": str(lengths.tokenizer_dir),
                "limit_key": key,
                "limit": value,
                **{
                    field: {split: f[field] for split, f in per_split.items()}
                    for field in ("rows", "over", "longest", "ids")
                },
            }
    return extra


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A parquet file as a list of dicts (for tests and inspection)."""
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows

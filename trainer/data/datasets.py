"""Training data for every phase, built from golden JSONL with the prompt builders of ``shared``.

Layout under ``--out``: ``<phase>/<split>.parquet`` (phases a1, a2, b1, b2, c1, c2; splits train and
validation) plus ``manifest.json`` (counts, prompt version, source files with sha256).

- SFT (A1, A2): one column ``messages`` (system, user, assistant) for VERL's ``sft_trainer``.
- RL (B1, B2, C1, C2): VERL's RLHFDataset columns ``prompt``, ``data_source``, ``ability``,
  ``reward_model`` {style, ground_truth}, ``extra_info`` {id, phase, prompt_version, index, split}.
  ``data_source`` is ``<reward kind>:<golden source>`` (``table:wikitabletext``, :mod:`trainer.data_source`),
  so VERL reports every validation metric per source.
  ``ground_truth`` is a JSON *string*: gold tables hold ragged, nullable lists that Arrow would
  coerce, so the reward function decodes it (see :func:`trainer.reward_client.decode_ground_truth`).
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
from shared.golden import sha256_file
from trainer.data.prompt_fit import Stage2Fit
from trainer.data_source import data_source

SFT_PHASES = ("a1", "a2")
RL_PHASES = ("b1", "b2", "c1")
BUILD_PHASES = SFT_PHASES + RL_PHASES
TRAIN_SPLITS = ("train", "validation")
DATA_SOURCE = {"b1": "schema", "b2": "table", "c1": "pipeline", "c2": "table"}
ABILITY = {"schema": "schema_extraction", "table": "table_extraction", "pipeline": "schema_extraction"}

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SFT_SCHEMA = pa.schema([("messages", pa.list_(_MESSAGE))])
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


def sft_row(phase: str, ex: GoldenExample) -> dict[str, Any]:
    """A1: Stage-1 prompt → canonical gold schema. A2: Stage-2 prompt on the gold schema → gold NDJSON."""
    if phase == "a1":
        msgs = build_stage1_messages(ex.text)
        target = canonical_schema_json(ex.schema_dict())
    elif phase == "a2":
        msgs = build_stage2_messages(ex.text, ex.schema_dict())
        target = gold_ndjson(ex.table_dict())
    else:
        raise ValueError(f"phase must be one of {list(SFT_PHASES)}, got {phase!r}")
    return {"messages": [*msgs, {"role": "assistant", "content": target}]}


def ground_truth(phase: str, ex: GoldenExample) -> dict[str, Any]:
    """What the reward needs: B1 the schema, B2/C2 the table, C1 schema + table + document."""
    if phase == "b1":
        return {"schema": ex.schema_dict()}
    if phase in ("b2", "c2"):
        return {"table": ex.table_dict()}
    if phase == "c1":
        return {"schema": ex.schema_dict(), "table": ex.table_dict(), "text": ex.text}
    raise ValueError(f"phase must be one of b1, b2, c1, c2, got {phase!r}")


def rl_row(
    phase: str, ex: GoldenExample, index: int, split: str, prompt: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """One RLHFDataset row; ``prompt`` overrides the phase's default (C2: the predicted schema)."""
    if prompt is None:
        if phase in ("b1", "c1"):
            prompt = build_stage1_messages(ex.text)
        elif phase == "b2":
            prompt = build_stage2_messages(ex.text, ex.schema_dict())
        else:
            raise ValueError(f"phase {phase!r} needs an explicit prompt")
    kind = DATA_SOURCE[phase]
    return {
        "prompt": prompt,
        "data_source": data_source(kind, ex.id),
        "ability": ABILITY[kind],
        "reward_model": {"style": "rule", "ground_truth": _dumps(ground_truth(phase, ex))},
        "extra_info": {"id": ex.id, "phase": phase, "prompt_version": PROMPT_VERSION, "index": index, "split": split},
    }


def write_parquet(rows: Sequence[dict[str, Any]], path: Path, schema: pa.Schema) -> int:
    """Write rows with an explicit Arrow schema (so empty files still carry the columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), path)
    return len(rows)


def update_manifest(out: Path, phase_counts: dict[str, dict[str, int]], sources: Iterable[Path], **extra: Any) -> Path:
    """Merge counts into ``out/manifest.json`` (C2 is added later by ``precompute-schemas``)."""
    path = out / "manifest.json"
    manifest: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"phases": {}, "sources": {}}
    manifest["prompt_version"] = PROMPT_VERSION
    manifest["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for phase, counts in phase_counts.items():
        manifest["phases"][phase] = {
            "counts": counts,
            "files": {s: f"{phase}/{s}.parquet" for s in counts},
            "kind": "sft" if phase in SFT_PHASES else "rl",
            **({"data_source": DATA_SOURCE[phase]} if phase in DATA_SOURCE else {}),
            **extra.get(phase, {}),
        }
    for src in sources:
        manifest["sources"][str(src.resolve())] = sha256_file(src)
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return path


def build_datasets(
    golden: Path,
    out: Path,
    phases: Sequence[str] = BUILD_PHASES,
    splits: Sequence[str] = TRAIN_SPLITS,
    limit: int | None = None,
    stage2_fit: Stage2Fit | None = None,
) -> dict[str, dict[str, int]]:
    """Write the parquet files of ``phases`` for ``splits``; returns counts per phase and split.

    With ``stage2_fit``, C1 drops documents whose Stage-2 prompt (on the gold schema) cannot fit the
    executor's context; their number and ids go to the manifest (``c1.stage2_too_long``)."""
    bad = [p for p in phases if p not in BUILD_PHASES]
    if bad:
        raise ValueError(f"--phases: unknown {bad}; choose from {list(BUILD_PHASES)} (c2: precompute-schemas)")
    counts: dict[str, dict[str, int]] = {p: {} for p in phases}
    too_long: dict[str, list[str]] = {}
    sources = []
    for split in splits:
        src = golden / golden_filename(split)
        if not src.is_file():
            raise FileNotFoundError(f"--golden: {src} is missing")
        sources.append(src)
        examples = read_golden(src, limit)
        for phase in phases:
            if phase in SFT_PHASES:
                rows = [sft_row(phase, ex) for ex in examples]
                counts[phase][split] = write_parquet(rows, out / phase / f"{split}.parquet", SFT_SCHEMA)
            else:
                kept = examples
                if phase == "c1" and stage2_fit is not None:
                    kept = [ex for ex in examples if stage2_fit.fits(build_stage2_messages(ex.text, ex.schema_dict()))]
                    too_long[split] = sorted({ex.id for ex in examples} - {ex.id for ex in kept})
                rows = [rl_row(phase, ex, i, split) for i, ex in enumerate(kept)]
                counts[phase][split] = write_parquet(rows, out / phase / f"{split}.parquet", RL_SCHEMA)
    extra: dict[str, Any] = {p: {"limit": limit} for p in phases}
    if "c1" in extra and stage2_fit is not None:
        extra["c1"] |= {**stage2_fit.describe(), "stage2_too_long": {k: len(v) for k, v in too_long.items()}}
        extra["c1"]["stage2_too_long_ids"] = too_long
    update_manifest(out, counts, sources, **extra)
    return counts


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A parquet file as a list of dicts (for tests and inspection)."""
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows

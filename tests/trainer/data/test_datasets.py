"""Parquet builders: VERL's column layout, prompts from shared, and a lossless ground-truth round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from shared import (
    PROMPT_VERSION,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    gold_ndjson,
    golden_filename,
    read_golden,
)
from shared.golden import source_of
from trainer.cli import app
from trainer.data.datasets import build_datasets, read_rows
from trainer.data.sample_data import SAMPLE_DIR
from trainer.in_verl.reward_batcher import build_item, decode_ground_truth


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds")
    build_datasets(SAMPLE_DIR, out)
    return out


def test_sft_rows_are_system_user_assistant(built: Path) -> None:
    train = read_golden(SAMPLE_DIR / golden_filename("train"))
    a1 = read_rows(built / "a1" / "train.parquet")
    a2 = read_rows(built / "a2" / "train.parquet")
    assert len(a1) == len(a2) == len(train) == 12
    for ex, r1, r2 in zip(train, a1, a2, strict=True):
        assert r1["messages"] == [*build_stage1_messages(ex.text),
                                  {"role": "assistant", "content": canonical_schema_json(ex.schema_dict())}]
        assert r2["messages"] == [*build_stage2_messages(ex.text, ex.schema_dict()),
                                  {"role": "assistant", "content": gold_ndjson(ex.table_dict())}]


@pytest.mark.parametrize(("phase", "source"), [("b1", "schema"), ("b2", "table"), ("c1", "pipeline")])
def test_rl_rows_follow_rlhf_format_and_round_trip(built: Path, phase: str, source: str) -> None:
    val = read_golden(SAMPLE_DIR / golden_filename("validation"))
    df = pd.read_parquet(built / phase / "validation.parquet")  # how VERL's RLHFDataset reads it
    assert list(df.columns) == ["prompt", "data_source", "ability", "reward_model", "extra_info"]
    assert len(df) == len(val) == 6
    for i, (ex, row) in enumerate(zip(val, df.to_dict("records"), strict=True)):
        assert row["data_source"] == f"{source}:{source_of(ex.id)}"  # per-source validation metrics in VERL
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"] == {"id": ex.id, "phase": phase, "prompt_version": PROMPT_VERSION, "index": i,
                                     "split": "validation"}
        want_prompt = (
            build_stage2_messages(ex.text, ex.schema_dict()) if phase == "b2" else build_stage1_messages(ex.text)
        )
        assert [dict(m) for m in row["prompt"]] == want_prompt
        gt = decode_ground_truth(row["reward_model"]["ground_truth"])
        if phase in ("b1", "c1"):
            assert gt["schema"] == ex.schema_dict()
        if phase in ("b2", "c1"):
            assert gt["table"] == ex.table_dict()  # nulls and ragged row counts survive
        if phase == "c1":
            assert gt["text"] == ex.text
        build_item(source, ex.id, "x", gt)  # the reward client accepts it


def test_real_golden_round_trip_with_nulls(golden_dir: Path, tmp_path: Path) -> None:
    build_datasets(golden_dir, tmp_path, ["c1"], limit=200)
    examples = read_golden(golden_dir / golden_filename("train"), 200)
    rows = read_rows(tmp_path / "c1" / "train.parquet")
    assert [decode_ground_truth(r["reward_model"]["ground_truth"])["table"] for r in rows] == [
        ex.table_dict() for ex in examples]


def test_manifest_and_cli(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["data", "build", "--golden", str(SAMPLE_DIR), "--out", str(tmp_path),
                                   "--phases", "a1,b2", "--limit", "5"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["prompt_version"] == PROMPT_VERSION
    assert manifest["phases"]["b2"]["counts"] == {"train": 5, "validation": 5}
    assert manifest["phases"]["b2"]["data_source"] == "table"
    assert set(manifest["phases"]) == {"a1", "b2"}
    # every split file is a source: the test split is read to find the train rows that repeat its documents
    assert len(manifest["sources"]) == 3 and all(len(h) == 64 for h in manifest["sources"].values())
    assert manifest["split_overlap"]["dropped_train"] == {"count": 0, "ids": []}
    bad = CliRunner().invoke(app, ["data", "build", "--golden", str(SAMPLE_DIR), "--out", str(tmp_path),
                                   "--phases", "a1,zz"])
    assert bad.exit_code == 2 and "zz" in bad.output

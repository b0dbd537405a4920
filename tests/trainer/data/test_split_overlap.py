"""No document is trained on and evaluated on (trainer/data/datasets.py, ``trainer data build``): the train rows
that repeat a validation or test document (same id, or same text whitespace and case aside) are dropped, counted
and named in the manifest; ``--strict-splits`` refuses them in one line; an empty split is an error."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared import GoldenExample, golden_filename, read_golden
from shared.golden import EmptySplitError
from shared.split_overlap import SplitOverlapError, train_examples
from tests.shared.test_split_overlap import DROPPED, overlapping_golden
from trainer.cli import app
from trainer.data.datasets import build_datasets, read_rows
from trainer.data.precompute import precompute_c2
from trainer.data.sample_data import SAMPLE_DIR


def ids(path: Path) -> list[str]:
    return [r["extra_info"]["id"] if "extra_info" in r else r["id"] for r in read_rows(path)]


def test_build_drops_train_rows_that_repeat_held_out_documents_and_records_them(tmp_path: Path) -> None:
    golden = overlapping_golden(tmp_path / "golden")
    counts = build_datasets(golden, tmp_path / "data", ["a1", "b1", "c1"])
    assert counts["a1"] == counts["b1"] == counts["c1"] == {"train": 11, "validation": 6}  # 14 train rows - 3
    for phase in ("a1", "b1", "c1"):
        train = ids(tmp_path / "data" / phase / "train.parquet")
        assert not set(train) & set(DROPPED) and len(train) == 11
        validation = ids(tmp_path / "data" / phase / "validation.parquet")
        assert validation == [ex.id for ex in read_golden(golden / golden_filename("validation"))]  # unchanged
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    recorded = manifest["split_overlap"]
    assert recorded["dropped_train"] == {"count": 3, "ids": DROPPED}
    assert recorded["strict"] is False and recorded["limit"] is None
    assert recorded["sizes"] == {"train": 14, "validation": 6, "test": 6}
    assert recorded["pairs"]["train~test"]["test_ids"] == ["invoice-test-000", "product-test-004"]
    assert recorded["pairs"]["train~test"]["shared_ids"] == ["invoice-test-000"]
    assert recorded["pairs"]["train~validation"]["train_ids"] == ["invoice-train-901"]
    assert recorded["key"].startswith("same id, or same sha256 of the text")
    assert str((golden / golden_filename("test")).resolve()) in manifest["sources"]


def test_with_a_limit_the_first_train_rows_are_checked_against_whole_held_out_splits(tmp_path: Path) -> None:
    golden = overlapping_golden(tmp_path / "golden")  # the renamed row (a test id) is the third train row
    counts = build_datasets(golden, tmp_path / "data", ["b1"], limit=3)
    assert counts["b1"] == {"train": 2, "validation": 3}
    recorded = json.loads((tmp_path / "data" / "manifest.json").read_text())["split_overlap"]
    assert recorded["dropped_train"] == {"count": 1, "ids": ["invoice-test-000"]} and recorded["limit"] == 3


def test_strict_splits_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    golden = overlapping_golden(tmp_path / "golden")
    with pytest.raises(SplitOverlapError) as err:
        build_datasets(golden, tmp_path / "data", ["b1"], strict_splits=True)
    assert "\n" not in str(err.value) and all(i in str(err.value) for i in DROPPED)
    assert not (tmp_path / "data").exists()
    assert build_datasets(SAMPLE_DIR, tmp_path / "clean", ["b1"], strict_splits=True)["b1"]["train"] == 12


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_an_empty_split_stops_the_build(tmp_path: Path, split: str) -> None:
    golden = overlapping_golden(tmp_path / "golden", empty=split)
    with pytest.raises(EmptySplitError, match=rf"common_{split}_schemas.jsonl: the {split} split is empty"):
        build_datasets(golden, tmp_path / "data", ["b1"])
    assert not (tmp_path / "data").exists()


def test_a_train_split_that_only_repeats_held_out_documents_is_empty(tmp_path: Path) -> None:
    golden = overlapping_golden(tmp_path / "golden")
    (golden / golden_filename("train")).write_text((golden / golden_filename("test")).read_text())
    with pytest.raises(EmptySplitError, match="every train row repeats a validation or test document"):
        build_datasets(golden, tmp_path / "data", ["b1"])


def test_data_build_command_prints_the_drop_and_refuses_with_strict_splits(tmp_path: Path) -> None:
    golden = overlapping_golden(tmp_path / "golden")
    cli = CliRunner()
    res = cli.invoke(app, ["data", "build", "--golden", str(golden), "--out", str(tmp_path / "d"), "--phases", "b1"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert f"dropped 3 train rows that repeat a validation or test document: {', '.join(DROPPED)}" in out
    res = cli.invoke(app, ["data", "build", "--golden", str(golden), "--out", str(tmp_path / "s"), "--phases", "b1",
                           "--strict-splits"])  # fmt: skip
    assert res.exit_code == 1 and not (tmp_path / "s").exists()
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --golden: splits share documents")
    assert all(i in lines[0] for i in DROPPED)
    empty = overlapping_golden(tmp_path / "empty", empty="test")
    res = cli.invoke(app, ["data", "build", "--golden", str(empty), "--out", str(tmp_path / "e"), "--phases", "b1"])
    assert res.exit_code == 1
    said = f"error: --golden: {empty / 'common_test_schemas.jsonl'}: the test split is empty (no examples)"
    assert res.output.strip() == said


def test_c2_and_other_train_samplers_leave_out_the_same_rows(tmp_path: Path) -> None:
    """C2's precompute, the RFT data and the preflight draw train documents through ``train_examples``."""
    golden = overlapping_golden(tmp_path / "golden")
    assert [ex.id for ex in train_examples(golden)] == [
        ex.id for ex in read_golden(golden / golden_filename("train")) if ex.id not in DROPPED
    ]

    def gold_schemas(examples: Sequence[GoldenExample], _split: str) -> list[str]:
        return [json.dumps(ex.schema_dict()) for ex in examples]

    rep = precompute_c2(golden, tmp_path / "data", gold_schemas, "gold")
    assert rep.counts == {"train": 11, "validation": 6}
    assert not set(ids(tmp_path / "data" / "c2" / "train.parquet")) & set(DROPPED)
    c2 = json.loads((tmp_path / "data" / "manifest.json").read_text())["phases"]["c2"]
    assert c2["dropped_train"] == DROPPED

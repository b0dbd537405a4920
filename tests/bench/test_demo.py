"""bench/demo.py: a demo folder, as the demo writes it (real scoring by write_outputs, the real curve and plot),
becomes bench/results/demo.{json,md,png} with every number read from it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench import common
from bench import demo as demo_result
from shared import GoldenExample, read_golden
from trainer.data.e2e_sample import E2E_SAMPLE_DIR
from trainer.demo.curve import paired, plot_reward_curve, reward_curve, what_it_shows
from trainer.demo.settings import RlSettings, SftSettings
from trainer.evaluation.phase_d import write_outputs


def demo_folder(out: Path) -> dict[str, object]:
    """The outputs of a demo over 4 documents: sft writes gold, pipe gold but for one empty table."""
    examples = read_golden(E2E_SAMPLE_DIR / "common_test_schemas.jsonl", 4)

    def rows(ex: GoldenExample) -> str:
        names = [c.name for c in ex.table.columns]
        return "\n".join(json.dumps(dict(zip(names, row, strict=True))) for row in ex.table.data)

    def preds(broken: int | None) -> list[dict[str, object]]:
        return [{"id": ex.id, "schema_prediction": json.dumps(ex.schema_dict()),
                 "table_prediction": "" if i == broken else rows(ex)}
                for i, ex in enumerate(examples)]  # fmt: skip

    res = write_outputs(out, examples, {"sft": preds(None), "pipe": preds(2)}, "t", compare=("sft", "pipe"))
    (out / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "data": {"val-core/pipeline:e2e/reward/mean@1": 0.4}}) + "\n"
        + json.dumps({"step": 1, "data": {"critic/score/mean": 0.5, "val-core/pipeline:e2e/reward/mean@1": 0.6}}) + "\n"
    )  # fmt: skip
    rl = RlSettings(steps=1)
    curve = reward_curve(out / "metrics.jsonl")
    plot_reward_curve(curve, out / "reward_curve.png", rl)
    test = paired(json.loads(res.metrics_path.read_text())["paired_tests"], "sft", "pipe")
    summary = {
        "recipe": "demo", "documents": 4, "total_seconds": 201.0,
        "parts": {"prepare": {"status": "ok", "seconds": 1.0}, "C1 GRPO": {"status": "ok", "seconds": 200.0}},
        "targets": {"aligned_cell_f1": {"min": 0.5, "sft": 1.0, "met": True}},
        "sft_settings": asdict(SftSettings()), "rl_settings": asdict(rl),
        "rl": {"curve": curve, "sft_to_pipe": test, "verdict": what_it_shows(test, rl)},
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(summary))
    return summary


def test_a_demo_folder_becomes_the_result_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    monkeypatch.setattr(common, "RESULTS_DIR", results)
    monkeypatch.setattr(demo_result, "RESULTS_DIR", results)
    summary = demo_folder(tmp_path / "demo_out")
    payload = demo_result.run(tmp_path / "demo_out", "make demo")
    saved = json.loads((results / "demo.json").read_text())
    assert saved["settings"]["sft"]["overall"]["aligned_cell_f1"] == 1.0
    assert saved["settings"]["pipe"]["overall"]["aligned_cell_f1"] == pytest.approx(0.75)  # one table of 4 empty
    assert list(saved["settings"]["pipe"]["per_source"]) == ["e2e"]
    assert saved["settings"]["pipe"]["ci95"]["overall"]["aligned_cell_f1"][0] <= 0.75
    assert saved["rl"]["verdict"] == summary["rl"]["verdict"] == payload["rl"]["verdict"]  # type: ignore[index]
    assert saved["run"]["machine"]["cores"] and saved["demo_command"] == "make demo"
    md = (results / "demo.md").read_text()
    assert "| pipe, e2e | 1.000 [" in md and "| total | 201 |" in md
    assert "sft → pipe | aligned_cell_f1 | 4 | -25.00 [" in md
    assert "aligned_cell_f1 ≥ 0.5 (1.000: met)" in md and "![C1's reward per step](demo.png)" in md
    assert (results / "demo.png").read_bytes() == (tmp_path / "demo_out" / "reward_curve.png").read_bytes()

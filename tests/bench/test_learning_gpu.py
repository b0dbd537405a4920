"""The learning report from what a GPU node brings back (Phase-D metrics, stage times), without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import learning_gpu as lg


def _setting(schema_f1: float, cell: float, n_e2e: int = 536, n_roto: int = 2475) -> dict[str, object]:
    overall = {
        "n": n_e2e + n_roto,
        "schema_valid": 0.99,
        "schema_f1": schema_f1,
        "table_valid": 0.99,
        "cell_accuracy": cell,
        "aligned_cell_f1": cell + 0.01,
        "aligned_row_exact_match": 0.83,
    }
    return {
        "overall": overall,
        "per_source": {
            "e2e": {**overall, "n": n_e2e},
            "rotowire_sent": {**overall, "n": n_roto, "cell_accuracy": cell - 0.05},
        },
    }


@pytest.fixture
def collected(tmp_path: Path) -> Path:
    d = tmp_path / "collected"
    (d / "phase_d").mkdir(parents=True)
    metrics = {"settings": {"base": _setting(0.1, 0.05), "sft": _setting(0.97, 0.91)}, "loop2": {"decision": "n/a"}}
    (d / "phase_d" / "metrics.json").write_text(json.dumps(metrics))
    (d / "stages.tsv").write_text("data_build\t100\t120\t20\nsft_a1\t120\t320\t200\nsft_a2\t120\t360\t240\n")
    (d / "a1_phase_result.json").write_text(json.dumps({"status": "ok", "seconds": 199.5}))
    return d


def test_json_has_the_layout_issue_12_asks_for(collected: Path) -> None:
    info = {"card": "NVIDIA H100 80GB HBM3", "gpus": 4, "versions": {"vllm": "0.24.0"}, "commands": ["x"]}
    p = lg.build(collected, info, partial="base and sft only")
    assert p["phase_d"]["sft"]["overall"]["schema_f1"] == 0.97
    assert p["phase_d"]["sft"]["per_source"]["rotowire_sent"]["cell_accuracy"] == pytest.approx(0.86)
    assert p["stages"]["sft_a2"]["seconds"] == 240.0
    assert p["test_documents"] == 3011 and p["gpus"] == 4 and p["card"].startswith("NVIDIA")
    assert p["sft_phases"]["a1"]["status"] == "ok"


def test_sft_is_compared_with_the_hf_baseline_honestly(collected: Path) -> None:
    p = lg.build(collected, {}, None)
    rows = {r["metric"]: r for r in p["sft_vs_hf_baseline"]}
    assert rows["schema_f1"]["gap_points"] == pytest.approx(0.3) and not rows["schema_f1"]["below"]
    assert rows["cell_accuracy"]["gap_points"] == pytest.approx(-1.4) and rows["cell_accuracy"]["below"]
    md = lg.render_md(p)
    assert "sft is below the baseline on 2 of 6 metrics (cell_accuracy, aligned_cell_f1)" in md


def test_markdown_marks_a_partial_run_and_shows_each_source(collected: Path) -> None:
    md = lg.render_md(lg.build(collected, {"card": "H100", "gpus": 4}, partial="base and sft only"))
    assert md.splitlines()[0].endswith("(partial run: base and sft only)")
    assert "### e2e" in md and "### rotowire_sent" in md
    assert "| sft_a1 | 200 |" in md


def test_main_writes_both_files(collected: Path, tmp_path: Path) -> None:
    info = tmp_path / "info.json"
    info.write_text(json.dumps({"card": "H100", "gpus": 4}))
    assert lg.main(["--collected", str(collected), "--run-info", str(info), "--out-dir", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "learning_gpu.json").read_text())["phase_d"]["base"]["overall"]["n"] == 3011
    assert (tmp_path / "r" / "learning_gpu.md").read_text().startswith("# Learning on GPUs")

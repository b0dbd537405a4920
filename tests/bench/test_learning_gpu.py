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


def test_json_has_phase_d_stages_and_node_layout(collected: Path) -> None:
    info = {"card": "NVIDIA H100 80GB HBM3", "gpus": 4, "versions": {"vllm": "0.24.0"}, "commands": ["x"]}
    p = lg.build(collected, info, partial="base and sft only")
    assert p["phase_d"]["sft"]["overall"]["schema_f1"] == 0.97
    assert p["phase_d"]["sft"]["per_source"]["rotowire_sent"]["cell_accuracy"] == pytest.approx(0.86)
    assert p["stages"]["sft_a2"]["seconds"] == 240.0
    assert p["test_documents"] == 3011 and p["gpus"] == 4 and p["card"].startswith("NVIDIA")
    assert p["sft_phases"]["a1"]["status"] == "ok"


def test_stage_times_come_from_a_job_sh_archive_too(collected: Path) -> None:
    """In job.sh's archive the run is one folder and stages.tsv sits in jobs/ beside it."""
    root = collected.parent / "archive"
    (root / "jobs").mkdir(parents=True)
    (collected / "stages.tsv").rename(root / "jobs" / "stages.tsv")
    p = lg.build(collected.rename(root / "loop"), {}, None)
    assert p["stages"]["sft_a2"]["seconds"] == 240.0


def test_a_recipes_part_times_and_phases_come_from_its_run_record(collected: Path) -> None:
    """Every recipe records each part's wall time and each phase's result in its run record (``run.json``)."""
    record = {
        "recipe": "pi2-ab",
        "parts": {
            "sft": {"status": "ok", "seconds": 411.5, "servers_s": 0.0},
            "rl": {"status": "ok", "seconds": 787.0, "servers_s": 12.5},
        },
        "phases": {"b2": {"phase": "b2", "status": "ok", "seconds": 700.0, "best_step": 5}},
    }
    (collected / "run.json").write_text(json.dumps(record))
    p = lg.build(collected, {}, None)
    assert p["stages"]["pi2-ab:sft"] == {"seconds": 411.5, "servers_s": 0.0}
    assert p["stages"]["pi2-ab:rl"]["servers_s"] == 12.5 and p["stages"]["sft_a2"]["seconds"] == 240.0
    assert p["rl_phases"]["b2"]["best_step"] == 5  # the record's, not a file's
    assert "| pi2-ab:rl | 787 | 12.5 |" in lg.render_md(p)


def test_sft_is_compared_with_the_hf_baseline_honestly(collected: Path) -> None:
    p = lg.build(collected, {}, None)
    rows = {r["metric"]: r for r in p["sft_vs_hf_baseline"]}
    assert rows["schema_f1"]["gap_points"] == pytest.approx(0.3) and not rows["schema_f1"]["below"]
    assert rows["cell_accuracy"]["gap_points"] == pytest.approx(-1.4) and rows["cell_accuracy"]["below"]
    md = lg.render_md(p)
    assert "sft is below the baseline on 2 of 6 metrics (cell_accuracy, aligned_cell_f1)" in md


def test_sft_meets_the_hf_baseline_on_the_baselines_sources_only(collected: Path) -> None:
    """The baseline saw E2E and RotoWire; a WikiTableText source in the test split must not count against
    sft: the comparison pools the baseline's two sources, weighted by their documents."""
    metrics = json.loads((collected / "phase_d" / "metrics.json").read_text())
    sft = metrics["settings"]["sft"]
    sft["per_source"]["wikitabletext"] = {**sft["overall"], "n": 671, "aligned_cell_f1": 0.5}
    sft["overall"] = {**sft["overall"], "aligned_cell_f1": 0.8}  # pooled with WikiTableText: below 0.942
    (collected / "phase_d" / "metrics.json").write_text(json.dumps(metrics))
    p = lg.build(collected, {}, None)
    rows = {r["metric"]: r for r in p["sft_vs_hf_baseline"]}
    e2e, roto = sft["per_source"]["e2e"], sft["per_source"]["rotowire_sent"]
    want = (e2e["cell_accuracy"] * e2e["n"] + roto["cell_accuracy"] * roto["n"]) / (e2e["n"] + roto["n"])
    assert rows["cell_accuracy"]["sft"] == pytest.approx(want, abs=1e-4)
    assert rows["aligned_cell_f1"]["sft"] == pytest.approx(e2e["aligned_cell_f1"], abs=1e-4)  # not 0.8
    assert p["sft_vs_hf_baseline_scope"].startswith("e2e + rotowire_sent, 3011 test documents")
    assert "On e2e + rotowire_sent, 3011 test documents" in lg.render_md(p)


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


def _rl_rows(gen: float, scores: list[float]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [{"step": 0, "data": {"val-core/x/reward/mean@1": 0.5}}]
    for i, s in enumerate(scores, start=1):
        data = {"critic/score/mean": s, "critic/score/min": s - 0.5, "critic/score/max": 1.0, "actor/entropy": 0.01}
        data |= {"timing_s/gen": gen, "timing_s/update_actor": 6.0, "timing_s/step": gen + 10.0}
        if i == len(scores):
            data["val-core/x/reward/mean@1"] = 0.6
        rows.append({"step": i, "data": data})
    return rows


@pytest.fixture
def collected_rl(collected: Path) -> Path:
    """An A/B run's layout: <phase>/phase_result.json, metrics.jsonl, early_stopping.json."""
    for ph, gen in (("b1", 4.0), ("c1", 5.0)):
        (collected / ph).mkdir()
        rows = _rl_rows(gen, [0.4, 0.5])
        (collected / ph / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (collected / ph / "phase_result.json").write_text(json.dumps({"status": "ok", "best_step": 2}))
        (collected / ph / "early_stopping.json").write_text(json.dumps({"best_step": 2, "best_score": 0.6}))
    return collected


def test_curves_step_split_and_the_reward_share(collected_rl: Path) -> None:
    p = lg.build(collected_rl, {}, None)
    steps = p["curves"]["c1"]["steps"]
    assert steps[0]["validation"] == {"x/reward/mean@1": 0.5} and "reward" not in steps[0]
    assert steps[2]["reward"] == {"mean": 0.5, "min": 0.0, "max": 1.0} and steps[2]["validation"]
    assert p["curves"]["b1"]["early_stopping"]["best_step"] == 2
    assert p["step_time_split_s"]["c1"]["gen"] == 5.0 and p["step_time_split_s"]["c1"]["step"] == 15.0
    share = p["reward_share_c1"]
    assert share["added_by_pipeline_reward_s"] == 1.0 and share["share_of_c1_step"] == pytest.approx(1 / 15, abs=1e-4)
    assert p["rl_phases"]["c1"]["status"] == "ok" and "c1" not in p["sft_phases"]
    md = lg.render_md(p)
    assert "## Learning curve: c1" in md and "Early stopping kept step 2" in md and "= 6.7% (goal ≤ 10%)" in md
    # no actor/kl_loss logged: the monitors cannot tell whether the policy moved, and say so
    assert p["monitors"]["c1"]["policy_moved"] is None and "## Did the policy move?" in md and "cannot tell" in md


def test_early_stopping_is_found_in_a_phase_folders_checkpoints(collected_rl: Path) -> None:
    """A collected experiment keeps each phase folder's layout: early_stopping.json sits in checkpoints/."""
    (collected_rl / "b1" / "checkpoints").mkdir()
    (collected_rl / "b1" / "early_stopping.json").rename(collected_rl / "b1" / "checkpoints" / "early_stopping.json")
    (collected_rl / "c1" / "early_stopping.json").unlink()
    p = lg.build(collected_rl, {}, None)
    assert p["curves"]["b1"]["early_stopping"]["best_step"] == 2
    assert "early_stopping" not in p["curves"]["c1"]


def test_the_report_says_when_the_policy_did_not_move(collected_rl: Path) -> None:
    import shutil

    fixtures = Path(__file__).resolve().parents[1] / "trainer" / "phase_rules" / "fixtures"
    recorded = fixtures / "b1_recorded_metrics.jsonl"
    shutil.copy(recorded, collected_rl / "b1" / "metrics.jsonl")  # a recorded B1 run on one H200
    p = lg.build(collected_rl, {}, None)
    m = p["monitors"]["b1"]
    assert m["policy_moved"] is False and m["kl_floor"] == 0.01 and m["trained_steps"] == 10
    assert "steps" not in m  # per-step values stay in the phase result, not the report
    md = lg.render_md(p)
    assert "- b1: POLICY DID NOT MOVE: the KL to the start policy stayed below 0.01" in md
    assert "| b1 | False | 0.00224 | 0.000108 | 0.000671 |" in md


def test_extra_settings_are_added_with_their_origin(collected: Path) -> None:
    old = {"phase_d": {"base": {"overall": {"n": 1}, "per_source": {}}, "zero": {"overall": {}, "per_source": {}}}}
    old["source"] = "old run"
    p = lg.build(collected, {}, None, old)
    assert p["phase_d"]["base"]["overall"]["n"] == 3011  # this run's own setting wins
    assert p["phase_d"]["zero"]["from"] == "old run"


def test_plot_is_written_when_there_are_curves(collected_rl: Path, tmp_path: Path) -> None:
    p = lg.build(collected_rl, {}, None)
    assert lg.plot(p, tmp_path / "x.png") == tmp_path / "x.png" and (tmp_path / "x.png").stat().st_size > 1000
    assert lg.plot(lg.build(collected_rl.parent / "collected", {}, None) | {"curves": {}}, tmp_path / "y.png") is None


def test_the_pi2_ab_report_has_macro_phase_d_and_pi2_on_gold_schemas(collected: Path, tmp_path: Path) -> None:
    metrics = json.loads((collected / "phase_d" / "metrics.json").read_text())
    for name, s in metrics["settings"].items():
        s["macro"] = {**s["overall"], "n": 2, "aligned_cell_f1": 0.5 if name == "base" else 0.7}
    (collected / "phase_d" / "metrics.json").write_text(json.dumps(metrics))
    (collected / "gold_schema_eval").mkdir()
    gold = {"sft": _setting(0.0, 0.80), "local": _setting(0.0, 0.83)}
    for s in gold.values():
        s["macro"] = dict(s["overall"])
    test = {"metric": "aligned_cell_f1", "baseline": "sft", "treatment": "local", "scope": "macro", "n": 3011,
            "diff": 0.03, "ci_low": 0.01, "ci_high": 0.05, "p_value": 0.002}  # fmt: skip
    (collected / "gold_schema_eval" / "metrics.json").write_text(json.dumps({"settings": gold, "paired_tests": [test]}))
    p = lg.build(collected, {}, None)
    assert p["phase_d"]["sft"]["macro"]["aligned_cell_f1"] == 0.7
    assert p["gold_schema"]["settings"]["local"]["overall"]["aligned_cell_f1"] == pytest.approx(0.84)
    md = lg.render_md(p)
    assert "macro mean over sources (the headline)" in md and "## π2 on gold schemas" in md
    assert "| aligned_cell_f1 | sft → local | macro | 3011 | +3.00 | [+1.00, +5.00] |" in md
    info = tmp_path / "info.json"
    info.write_text("{}")
    out = tmp_path / "r"
    assert lg.main(["--collected", str(collected), "--run-info", str(info), "--out-dir", str(out), "--name", "x2"]) == 0
    assert (out / "x2.json").is_file() and (out / "x2.md").is_file()


def test_a_run_without_phase_d_reports_validation_per_source(collected: Path) -> None:
    """A run cut during RL: no Phase D, but the per-source validation curve is the result."""
    import shutil

    shutil.rmtree(collected / "phase_d")
    (collected / "b1").mkdir()
    e2e, wtt = "val-core/schema:e2e/reward/mean@1", "val-core/schema:wikitabletext/reward/mean@1"
    rows = [
        {"step": 0, "data": {e2e: 0.9781, wtt: 0.5932}},
        {"step": 5, "data": {e2e: 0.9739, wtt: 0.6032, "critic/score/mean": 0.6, "timing_s/step": 50.0}},
    ]
    (collected / "b1" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    p = lg.build(collected, {}, "the allocation ended during RL")
    assert p["phase_d"] == {} and p["test_documents"] == 0 and p["sft_vs_hf_baseline"] == []
    v = p["validation_per_source"]["b1"]
    assert [r["step"] for r in v] == [0, 5]
    assert v[1]["change_points"] == {"e2e": -0.42, "wikitabletext": 1.0, "macro": pytest.approx(0.29, abs=0.01)}
    md = lg.render_md(p)
    assert "**No Phase D in this run** (nothing on the test split): the allocation ended during RL" in md
    assert "| b1 | 5 | 0.9739 (-0.42) | 0.6032 (+1.00) |" in md


def test_stage1_alone_on_the_test_split_is_reported_per_source(collected: Path) -> None:
    """Phase D did not fit, but B1's schemas were scored on the test split alone."""
    (collected / "stage1_eval").mkdir()
    wtt = {"n": 671, "schema_valid": 1.0, "schema_precision": 0.63, "schema_recall": 0.627, "schema_f1": 0.6215}
    s1 = {
        "sft": {"overall": wtt, "per_source": {"wikitabletext": wtt},
                "ci95": {"per_source": {"wikitabletext": {"schema_f1": [0.602, 0.641]}}}},
        "local": {"overall": {**wtt, "schema_f1": 0.6235},
                  "per_source": {"wikitabletext": {**wtt, "schema_f1": 0.6235}},
                  "ci95": {"per_source": {"wikitabletext": {"schema_f1": [0.604, 0.643]}}}},
    }  # fmt: skip
    test = {"metric": "schema_f1", "baseline": "sft", "treatment": "local", "scope": "pooled", "n": 671,
            "diff": 0.002, "ci_low": -0.0117, "ci_high": 0.0151, "p_value": 0.792}  # fmt: skip
    (collected / "stage1_eval" / "metrics.json").write_text(json.dumps({"settings": s1, "paired_tests": [test]}))
    p = lg.build(collected, {}, "no Phase D")
    assert p["stage1"]["settings"]["local"]["per_source"]["wikitabletext"]["schema_f1"] == 0.6235
    md = lg.render_md(p)
    assert "## π1 on the test split, Stage 1 alone (B1's target" in md
    assert "test documents: 3011 end to end; 671 scored" in md
    assert "| wikitabletext | 671 | schema_f1 | 0.6215 [0.602, 0.641] | 0.6235 [0.604, 0.643] |" in md
    assert "| schema_f1 | sft → local | pooled | 671 | +0.20 | [-1.17, +1.51] | 0.792 |" in md
    assert lg.build(collected.parent / "nothing", {}, None)["stage1"] is None

"""bench/sft_mix.py: the choice on validation, the repeat check and the report, from files the node script writes
(scored by the project's own evaluation code on the bundled sample), and the node script's own syntax."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import sft_mix
from shared import canonical_schema_json, gold_ndjson, golden_filename, read_golden
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.inference import write_jsonl
from trainer.evaluation.phase_d import load_predictions, write_outputs

REPO = Path(__file__).resolve().parents[2]
VAL = read_golden(SAMPLE_DIR / golden_filename("validation"))


def records(stage: str, right: int) -> list[dict]:
    """``trainer infer`` records: the gold answer (π1's schema, π2's table) for the first ``right`` documents,
    a wrong one for the rest."""
    out = []
    for i, ex in enumerate(VAL):
        gold = canonical_schema_json(ex.schema_dict()) if stage == "stage1" else gold_ndjson(ex.table_dict())
        wrong = "{}" if stage == "stage1" else ""
        out.append({"id": ex.id, "stage": stage, "prediction": gold if i < right else wrong, "truncated": False})
    return out


def stage1(right: int) -> list[dict]:
    return records("stage1", right)


def stage2(right: int) -> list[dict]:
    return records("stage2", right)


def scored(root: Path, folder: str, base: list[dict], mix: list[dict]) -> None:
    for name, recs in (("base", base), ("mix", mix)):
        write_jsonl(root / f"{folder}_{name}.jsonl", recs)
    preds = {n: load_predictions(root / f"{folder}_{n}.jsonl") for n in ("base", "mix")}
    write_outputs(root / folder, VAL, preds, folder, write_predictions=False, max_truncated_share=1.0)


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """What the node script leaves in its folder after the validation wave (π1: mix better; π2: base better)."""
    root = tmp_path / "mix"
    scored(root, "val_pi1", stage1(2), stage1(len(VAL)))
    (root / "run_info.json").write_text(json.dumps({"sft_mix": "people=2", "commit": "abc", "sft_seed": None}))
    scored(root, "val_pi2", stage2(len(VAL)), stage2(3))
    return root


def test_choose_takes_the_higher_macro_mean_per_policy(node_root: Path) -> None:
    choice = sft_mix.choose(node_root)
    assert json.loads((node_root / "choice.json").read_text()) == choice
    assert choice["pi1"]["chosen"] == "mix" and choice["pi2"]["chosen"] == "base"
    pi1 = choice["pi1"]
    assert pi1["metric"] == "schema_f1" and pi1["macro"]["mix"] == pytest.approx(1.0)
    assert pi1["macro"]["base"] < pi1["macro"]["mix"]
    assert pi1["paired"]["baseline"] == "base" and pi1["paired"]["treatment"] == "mix" and pi1["paired"]["diff"] > 0
    assert choice["pi2"]["metric"] == "aligned_cell_f1" and choice["pi2"]["paired"]["diff"] < 0


def test_a_tie_keeps_base_and_missing_scores_are_named(node_root: Path) -> None:
    scored(node_root, "val_pi1", stage1(3), stage1(3))
    assert sft_mix.choose(node_root)["pi1"]["chosen"] == "base"
    shutil.rmtree(node_root / "val_pi2")
    with pytest.raises(FileNotFoundError, match=r"val_pi2/metrics.json: the validation scores of pi2"):
        sft_mix.choose(node_root)


def test_repeat_summary_counts_answers_that_differ(node_root: Path) -> None:
    (node_root / "val").mkdir()
    lines = (SAMPLE_DIR / golden_filename("validation")).read_text().splitlines()
    (node_root / "val" / "repeat_golden.jsonl").write_text("\n".join(lines) + "\n")
    (node_root / "repeat").mkdir()
    for run in sft_mix.REPEAT_RUNS:
        write_jsonl(node_root / "repeat" / f"batch_invariant_{run}.jsonl", stage1(4))
        write_jsonl(node_root / "repeat" / f"default_{run}.jsonl", stage1(5 if run == "c32" else 4))
    rep = sft_mix.repeat_summary(node_root)
    assert rep["documents"] == len(VAL)
    assert rep["batch_invariant"]["repeats"] is True
    default = rep["default"]
    assert default["repeats"] is False and default["c256_2"]["differ_from_first"] == 0
    assert default["c32"]["differ_from_first"] == 1 and default["c32"]["differ_ids"] == [VAL[4].id]
    assert default["c32"]["schema_f1"] > default["c256_1"]["schema_f1"]
    # repeat_check.sh's settings: any mode name, its lower concurrency run c16
    for run in ("c256_1", "c256_2", "c16"):
        write_jsonl(node_root / "repeat" / f"bi_graphs_noprefix_{run}.jsonl", stage1(4))
    rep = sft_mix.repeat_summary(node_root)
    assert list(rep) == ["documents", "batch_invariant", "default", "bi_graphs_noprefix"]
    assert rep["bi_graphs_noprefix"]["repeats"] is True and set(rep["bi_graphs_noprefix"]) == {
        "c256_1", "c256_2", "c16", "repeats"}  # fmt: skip
    (node_root / "repeat" / "batch_invariant_c32.jsonl").unlink()
    assert sft_mix.repeat_summary(node_root)["batch_invariant"] == {"missing": ["c32"]}


def test_report_reads_the_archive(node_root: Path, tmp_path: Path) -> None:
    sft_mix.choose(node_root)
    (node_root / "a1_base").mkdir()
    logged = [{"step": 1, "data": {"train/loss": 1.2}}, {"step": 280, "data": {"val/loss": 0.05}}]
    logged.append({"step": 560, "data": {"val/loss": 0.04}})
    (node_root / "a1_base" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in logged) + "\n")
    result = {"status": "ok", "best_step": 560, "seconds": 300}
    (node_root / "a1_base" / "phase_result.json").write_text(json.dumps(result))
    (node_root.parent / "jobs").mkdir()
    (node_root.parent / "jobs" / "stages.tsv").write_text("a1_base\t100\t420\t320\nmix\t0\t900\t900\n")
    scored(node_root, "test", stage1(3), stage1(6))
    p = sft_mix.build(node_root.parent)
    assert p["sft"]["a1_base"] == {"status": "ok", "steps": 560, "exported_step": 560, "batch": 32, "epoch_s": None,
                                   "phase_seconds": 300, "job_seconds": 320, "epoch_selection": None,
                                   "val_loss": [(280, 0.05), (560, 0.04)]}  # fmt: skip
    assert p["treatment"] == "mix"
    assert p["stages"]["mix"] == 900
    assert set(p["validation"]) == {"pi1", "pi2"} and p["choice"]["pi1"]["chosen"] == "mix"
    assert p["test"]["schema_f1"]["mix"]["macro"] == pytest.approx(1.0)
    md = sft_mix.render_md(p, "python -m bench sft-mix report")
    assert "## The choice (validation, macro mean over sources)" in md and "| pi1 | schema_f1 |" in md
    assert "280: 0.0500, 560: 0.0400" in md
    assert sft_mix.plot(p, tmp_path / "p.png") == tmp_path / "p.png" and (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("script", "needs"), [("sft_mix.sh", "MODEL_DIR (the base model) must be set"), ("repeat_check.sh", "MODEL (an HF")]
)
def test_the_node_scripts_parse_and_name_what_they_need(script: str, needs: str) -> None:
    path = REPO / "scripts" / "gpu_node" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode != 0 and needs in res.stderr


@pytest.mark.parametrize("name", ["base", "Mix", "a b", "a_b"])
def test_the_node_script_refuses_a_treatment_name_it_cannot_file(name: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TREATMENT": name, "MODEL_DIR": "/m", "GOLDEN_DIR": "/g", "MIX_OUT": str(tmp_path)}
    path = REPO / "scripts" / "gpu_node" / "sft_mix.sh"
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and f"TREATMENT: '{name}' (lower-case letters and digits, not base)" in res.stderr
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_seeds_combine_into_per_seed_and_mean_differences(tmp_path: Path) -> None:
    seeds = []
    for k, right in enumerate((4, 6)):
        root = tmp_path / f"s{k}" / "mix"
        scored(root, "test", stage1(2), stage1(right))  # a pipeline-less stand-in: schema F1 is the paired metric
        (root / "run_info.json").write_text(json.dumps({"sft_seed": k, "commit": "abc"}))
        p = sft_mix.build(root.parent)
        assert p["test"]["paired"], p["test"]
        for t in p["test"]["paired"]:  # name the settings as the node script does
            t["baseline"], t["treatment"] = "sft", "mix"
        p["test"]["phase_d"] = {"sft": p["test"]["schema_f1"]["base"], "mix": p["test"]["schema_f1"]["mix"]}
        seeds.append(p)
    c = sft_mix.combine(seeds)
    macro = next(t for t in c["paired"] if t["scope"] == "macro")
    assert macro["seeds"] == 2 and len(macro["per_seed"]) == 2
    each = [x["diff"] for x in macro["per_seed"]]
    assert each[1] > each[0] > 0 and macro["diff"] == pytest.approx(sum(each) / 2)
    assert macro["low"] == pytest.approx(sum(x["low"] for x in macro["per_seed"]) / 2)
    assert c["phase_d"]["mix"]["seeds"] == 2 and c["phase_d"]["mix"]["macro"] > c["phase_d"]["sft"]["macro"]
    md = sft_mix.render_combined(c, seeds, "cmd")
    assert "| macro |" in md and "over seeds" in md
    assert sft_mix.plot(seeds[0], tmp_path / "c.png", c) == tmp_path / "c.png"


def test_seeds_pool_document_by_document_when_the_rows_came_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gzip

    monkeypatch.setenv("GOLDEN_DIR", str(SAMPLE_DIR))
    test = read_golden(SAMPLE_DIR / golden_filename("test"))

    def rows(right: int) -> str:
        return "".join(
            json.dumps({"id": ex.id, "schema_prediction": canonical_schema_json(ex.schema_dict()),
                        "table_prediction": gold_ndjson(ex.table_dict()) if i < right else ""}) + "\n"
            for i, ex in enumerate(test)
        )  # fmt: skip

    seeds = []
    for k, (sft_right, mix_right) in enumerate(((2, 4), (2, 6))):
        root = tmp_path / f"s{k}" / "mix"
        root.mkdir(parents=True)
        (root / "run_info.json").write_text(json.dumps({"sft_seed": k}))
        for name, right in (("sft", sft_right), ("mix", mix_right)):
            with gzip.open(root / f"test_rows_{name}.jsonl.gz", "wt") as f:
                f.write(rows(right))
        p = sft_mix.build(root.parent)
        assert set(p["test_rows"]) == {"sft", "mix"}
        p["test"] = {"phase_d": {}, "paired": []}
        seeds.append(p)
    pooled = sft_mix.combine(seeds)["pooled_over_seeds"]
    overall = next(t for t in pooled if t["scope"] == "pooled")
    # documents 2-3 right in both seeds' mix, 4-5 in one: the mean over seeds gains (2 + 2 * 0.5) / 6
    assert overall["n"] == len(test) and overall["diff"] == pytest.approx(3 / len(test))
    assert "Paired over seeds" in sft_mix.render_combined(sft_mix.combine(seeds), seeds, "cmd")


def test_a_named_treatment_is_chosen_reported_and_plotted_by_examples_seen(node_root: Path, tmp_path: Path) -> None:
    """A treatment other than the mix (``TREATMENT=epochs``): its runs, its Phase D setting and its curve by
    examples seen, with the epoch its phase exported."""
    info = json.loads((node_root / "run_info.json").read_text())
    (node_root / "run_info.json").write_text(json.dumps({**info, "treatment": "epochs", "treatment_args": "x=1"}))
    for folder in ("val_pi1", "val_pi2"):  # the treatment's scores under its own name
        m = json.loads((node_root / folder / "metrics.json").read_text())
        m["settings"]["epochs"] = m["settings"].pop("mix")
        for t in m["paired_tests"]:
            t["treatment"] = "epochs"
        (node_root / folder / "metrics.json").write_text(json.dumps(m))
    choice = sft_mix.choose(node_root)
    assert (choice["pi1"]["chosen"], choice["pi2"]["chosen"], choice["pi1"]["treatment"]) == (
        "epochs",
        "base",
        "epochs",
    )
    (node_root / "a1_epochs").mkdir()
    logged = [{"step": 280, "data": {"val/loss": 0.05}}, {"step": 560, "data": {"val/loss": 0.06}}]
    (node_root / "a1_epochs" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in logged) + "\n")
    sel = {"chosen_step": 280, "chosen_epoch": 1.0, "curve": []}
    result = {"status": "ok", "best_step": 280, "seconds": 200, "epoch_selection": sel,
              "command": ["torchrun", "data.train_batch_size=128", "trainer.total_epochs=2"]}  # fmt: skip
    (node_root / "a1_epochs" / "phase_result.json").write_text(json.dumps(result))
    tqdm = "Epoch 1/2: 100%|##| 279/279 [01:00<00:00]\rEpoch 2/2:  50%|#| 140/280 [00:30<00:30]\n"
    (node_root / "a1_epochs" / "train.log").write_text(tqdm)  # the last epoch's loop: 30 s for half of 280 steps
    scored(node_root, "test", stage1(3), stage1(6))
    m = json.loads((node_root / "test" / "metrics.json").read_text())
    m["settings"]["epochs"] = m["settings"].pop("mix")
    (node_root / "test" / "metrics.json").write_text(json.dumps(m))
    p = sft_mix.build(node_root)
    run = p["sft"]["a1_epochs"]
    assert (run["batch"], run["steps"], run["exported_step"], run["epoch_selection"]) == (128, 560, 280, sel)
    assert set(p["sft"]) == {"a1_base", "a1_epochs", "a2_base", "a2_epochs"}
    md = sft_mix.render_md(p, "python -m bench sft-mix report")
    assert md.startswith("# SFT recipes, epochs against base") and "treatment_args `x=1`" in md
    assert "| a1_epochs | ok | 128 | 560 | 280 (epoch 1) | 60 | 200 |" in md
    assert "| policy | metric | base | epochs | epochs − base, paired | chosen |" in md
    assert sft_mix.plot(p, tmp_path / "e.png") == tmp_path / "e.png"
    with pytest.raises(ValueError, match="different treatments"):
        sft_mix.combine([p, {**p, "treatment": "mix"}])

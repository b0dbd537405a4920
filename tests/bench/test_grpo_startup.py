"""The GRPO start-up report from probe runs: markers read off real VERL / vLLM / Ray log lines (copied
from a run on one H200), the stages between them, and unfinished runs kept out of the timings."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bench import grpo_startup as gs

# Lines as VERL 0.9.1, vLLM 0.24.0 and Ray 2.60.0 wrote them on the node (ANSI prefixes kept).
LOG = (Path(__file__).parent / "data" / "probe_train.log").read_text()
START = dt.datetime(2026, 11, 26, 16, 17, 54, 950000, tzinfo=dt.UTC).timestamp()


def write_run(folder: Path, end: float | None) -> None:
    folder.mkdir(parents=True)
    (folder / "start").write_text(f"{START:.6f}\n")
    (folder / "train.log").write_text(LOG)
    if end is not None:
        (folder / "end").write_text(f"{end:.6f}\n")
        (folder / "run.rc").write_text("0\n")


def test_line_time_reads_verl_ray_and_vllm_stamps_as_utc() -> None:
    assert gs.line_time("x INFO:2026-11-26 16:19:05,059:train", 2026) == pytest.approx(START + 70.109, abs=1e-3)
    assert gs.line_time("2026-11-26 16:18:15,892\tINFO worker.py", 2026) == pytest.approx(START + 20.942, abs=1e-3)
    assert gs.line_time("(EngineCore pid=1) INFO 11-26 16:20:50 [core.py:114] x", 2026) == pytest.approx(START + 175.05)
    assert gs.line_time("no stamp here", 2026) is None


def test_stages_run_from_start_through_every_marker_to_the_end(tmp_path: Path) -> None:
    write_run(tmp_path / "p1", end=START + 342.0)
    r = gs.read_run(tmp_path / "p1")
    assert r["exit_code"] == 0 and r["total_seconds"] == 342.0
    assert r["seconds_to_first_generation"] == pytest.approx(245.6, abs=0.1)
    by = {s["to"]: s["seconds"] for s in r["stages"]}
    assert by["ray_started"] == pytest.approx(20.9, abs=0.1)
    assert by["actor_ref_ready"] == pytest.approx(31.1, abs=0.1)  # from "create worker group"
    assert by["vllm_server_up"] == pytest.approx(33.2, abs=0.1)  # the first of the two server lines
    assert by["vllm_engine_ready"] == pytest.approx(20.0, abs=0.1)
    assert by["end"] == pytest.approx(342.0 - 245.6, abs=0.1)
    assert sum(s["seconds"] for s in r["stages"]) == pytest.approx(342.0, abs=0.3)  # nothing lost between stages


def test_build_keeps_unfinished_runs_out_of_the_timings(tmp_path: Path) -> None:
    write_run(tmp_path / "p1", end=START + 342.0)
    write_run(tmp_path / "p2", end=None)
    (tmp_path / "card.txt").write_text("0, NVIDIA H200, 143771 MiB, 580.159.04\n")
    (tmp_path / "versions.json").write_text(json.dumps({"vllm": "0.24.0", "verl": "0.9.1"}))
    p = gs.build(tmp_path, notes="## Notes\n\nx")
    assert [r["run"] for r in p["runs"]] == ["p1"] and p["unfinished"] == ["p2"]
    md = gs.render_md(p)
    assert "| p1 | 0 | 342 | 246 | – | – |" in md and "Still running when collected (not timed): p2." in md
    assert "card: 0, NVIDIA H200" in md and "vllm 0.24.0" in md and md.rstrip().endswith("x")
    (tmp_path / "no_runs").mkdir()
    with pytest.raises(FileNotFoundError, match="--collected: no probe run"):
        gs.build(tmp_path / "no_runs")


def test_build_reads_a_job_sh_archive(tmp_path: Path) -> None:
    """One job per probe run: its times from jobs/stages.tsv, its log in the collected probe folder."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("reward_api", "p1", "p2"):
        (jobs / f"{name}.log").write_text("")
    (jobs / "p1.rc").write_text("0\n")
    (jobs / "stages.tsv").write_text(f"p1\t{START:.0f}\t{START + 342:.0f}\t342\n")
    for name in ("p1", "p2"):
        (tmp_path / "probe" / name).mkdir(parents=True)
        (tmp_path / "probe" / name / "train.log").write_text(LOG)
    p = gs.build(tmp_path)
    assert [r["run"] for r in p["runs"]] == ["p1"] and p["unfinished"] == ["p2"]  # reward_api: no probe run
    assert p["runs"][0]["exit_code"] == 0 and p["runs"][0]["total_seconds"] == 342.0
    assert p["runs"][0]["seconds_to_first_generation"] == pytest.approx(245.6, abs=1.0)


def test_a_run_reports_its_wait_for_the_reward_api_and_its_step_times(tmp_path: Path) -> None:
    """C1 started beside its executors: the trainer's own record of the wait, and VERL's step timings."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "c1_beside.log").write_text("")
    (jobs / "c1_beside.rc").write_text("0\n")
    (jobs / "stages.tsv").write_text(f"c1_beside\t{START:.0f}\t{START + 400:.0f}\t400\n")
    run = tmp_path / "probe" / "c1_beside"
    (run / "checkpoints").mkdir(parents=True)
    (run / "train.log").write_text(LOG)
    ready = {"url": "http://127.0.0.1:18412", "pipeline": True, "waited_s": 12.5, "ready_at_unix": START + 240.0}
    (run / "checkpoints" / "reward_ready.json").write_text(json.dumps(ready))
    steps = [{"step": 0, "data": {"val-core/x": 0.1}}]
    steps += [
        {"step": i, "data": {"timing_s/step": t, "timing_s/gen": g}} for i, t, g in ((1, 30.0, 6.0), (2, 34.0, 8.0))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    p = gs.build(tmp_path)
    [r] = p["runs"]
    assert r["reward_api"] == {"waited_s": 12.5, "ready_after_start_s": 240.0}
    assert r["steps"] == {"step": 32.0, "gen": 7.0}
    assert "| c1_beside | 0 | 400 | 246 | 12.5 (ready at +240.0) | 32.0 (gen 7.0) |" in gs.render_md(p)


def test_vllm_info_lines_split_the_engine_start_into_its_processes_and_steps() -> None:
    """With vLLM at INFO (lines copied from a B1 start on one H200), the engine's start is its config, the
    EngineCore and worker processes (each a spawn and an import), the weights, profiling, KV cache and graphs."""
    log = (Path(__file__).parent / "data" / "probe_train_vllm_info.log").read_text().splitlines()
    found = gs.markers(log, 2026)
    start = found["ray_started"] - 26.0
    by = {s["to"]: s["seconds"] for s in gs.stages(start, None, found)}
    assert by["vllm_server_up"] == pytest.approx(23.3, abs=0.1)  # 08:30:54.7 -> 08:31:18
    assert by["vllm_engine_config"] == pytest.approx(1.0)
    assert by["vllm_engine_init"] == pytest.approx(16.0)  # the EngineCore process: spawn + import
    assert by["vllm_worker_up"] == pytest.approx(19.0)  # the worker process: spawn + import
    assert by["vllm_model_loaded"] == pytest.approx(2.0)
    assert by["vllm_kv_sized"] == pytest.approx(2.0) and by["vllm_graphs"] == pytest.approx(2.0)
    assert by["vllm_engine_ready"] == pytest.approx(0.0)
    assert by["first_generation"] == pytest.approx(20.9, abs=0.1)  # 08:32:03.05 -> 08:32:24

"""The loop on GPU nodes: phases placed by the GPU plan, side by side where the node allows, --until.

The phases are recorded by a runner that only pretends to train (no GPU here); what is checked is
what the loop asks for: each phase's GPUs, its overrides, and which phases overlapped in time.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from tests.trainer.runs.test_loop import SAMPLE, recorded, recorded_as_run
from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs.c2_data import PRECOMPUTE_KEY, precompute_key
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop
from trainer.runs.record import RECORD


class RecordingRunnerForTests:
    """Every phase 'succeeds' after a short sleep and leaves an export; launches and times are kept."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds
        self.runs: dict[str, PhaseRun] = {}
        self.spans: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def __call__(self, run: PhaseRun) -> PhaseResult:
        start = time.monotonic()
        time.sleep(self.seconds)
        hf = run.out_dir / "hf"
        res = recorded(run.out_dir, run.phase.name, hf)
        with self.lock:
            self.runs[run.phase.name] = run
            self.spans[run.phase.name] = (start, time.monotonic())
        return res

    def overlap(self, a: str, b: str) -> bool:
        (s1, e1), (s2, e2) = self.spans[a], self.spans[b]
        return s1 < e2 and s2 < e1


def config(out: Path, gpus: tuple[str, ...], until: str | None = None) -> LoopConfig:
    return LoopConfig(
        golden=SAMPLE, out=out, profile="gpu", pi1_sft=None, pi2_sft=None, base_model="/base",
        reward_url="http://127.0.0.1:9", c1_reward_url="http://127.0.0.1:10", rl_extra=("x=1",),
        gpus=gpus, until=until,
    )  # fmt: skip


def test_four_gpus_run_pairs_side_by_side_on_disjoint_halves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.serving import reward_api
    from trainer.serving.identity import ServedModel

    checked: list[tuple[str, str]] = []

    def served_as_expected(url: str, expected: str, what: str, **_: object) -> ServedModel:
        checked.append((url, expected))  # the identity check itself is tested in tests/trainer/serving
        return ServedModel(url, "pi2-x", None, "test", expected, "x")

    monkeypatch.setattr(reward_api, "check_reward_api_url", served_as_expected)
    out = tmp_path / "loop"
    runner = RecordingRunnerForTests()
    manifest = Loop(config(out, ("0", "1", "2", "3"), until="local"), runner=runner).run()
    assert manifest["stopped_after"] == "local" and set(runner.runs) == {"a1", "a2", "b1", "b2"}
    assert runner.overlap("a1", "a2") and runner.overlap("b1", "b2")
    a1, a2, b1, b2 = (runner.runs[p] for p in ("a1", "a2", "b1", "b2"))
    # SFT: one GPU of each half (a second rank made it slower on 4 x H100); no RL overrides
    assert (a1.gpus, a2.gpus, a1.nproc, a2.nproc) == (("0",), ("2",), 1, 1)
    assert a1.overrides == ("trainer.n_gpus_per_node=1",) and a1.env({})["CUDA_VISIBLE_DEVICES"] == "0"
    assert b2.gpus == ("2", "3") and b1.overrides[0] == "trainer.n_gpus_per_node=2"
    assert b1.overrides[-1] == "x=1"  # the user's overrides come last and win
    assert b1.model_path == str(out / "a1" / "hf") and b2.model_path == str(out / "a2" / "hf")
    assert b1.env({})["CUDA_VISIBLE_DEVICES"] == "0,1" and b1.env({})["NCCL_NVLS_ENABLE"] == "0"
    # a rerun goes on from there: C1 on the trainer's GPUs (its executors would take GPUs 2 and 3) ...
    cfg_c1 = config(out, ("0", "1", "2", "3"), until="c1")
    runner2 = RecordingRunnerForTests(0.01)
    manifest = Loop(cfg_c1, runner=runner2).run()
    assert list(runner2.runs) == ["c1"] and manifest["stopped_after"] == "c1"
    assert runner2.runs["c1"].gpus == ("0", "1") and runner2.runs["c1"].reward_url == "http://127.0.0.1:10"
    assert checked == [("http://127.0.0.1:10", str(out / "b2" / "hf"))]  # C1's reward API serves π2ʳ-local
    # ... then (the precompute recorded with its content key) C2 on the whole node
    (out / "data" / "c2").mkdir(parents=True)
    (out / "data" / "c2" / "train.parquet").write_bytes(b"")
    key = precompute_key(cfg_c1, str(out / "c1" / "hf"), "gold")
    (out / "data" / "c2" / PRECOMPUTE_KEY).write_text(json.dumps(key))
    runner3 = RecordingRunnerForTests(0.01)
    manifest = Loop(config(out, ("0", "1", "2", "3"), until="c2"), runner=runner3).run()
    assert list(runner3.runs) == ["c2"] and manifest["stopped_after"] == "c2"
    assert runner3.runs["c2"].gpus == ("0", "1", "2", "3")
    m = json.loads((out / RECORD).read_text())
    assert all(m["parts"][p]["status"] == "ok" for p in ("sft", "local", "c1", "c2"))
    # ... and Phase D scores the base model beside sft, local and pipe (one wave on four GPUs)
    asked: list[dict[str, tuple[str, str]]] = []

    def phase_d_recorded(_loop: object, settings: dict[str, tuple[str, str]], *_a: object) -> dict[str, str]:
        asked.append(settings)
        return {"decision": "stop"}

    monkeypatch.setattr(Loop, "evaluate", phase_d_recorded)
    Loop(config(out, ("0", "1", "2", "3")), runner=RecordingRunnerForTests(0.01)).run()
    assert list(asked[0]) == ["base", "sft", "local", "pipe"] and asked[0]["base"] == ("/base", "/base")
    assert asked[0]["pipe"] == (str(out / "c1" / "hf"), str(out / "c2" / "hf"))
    Loop(
        dataclasses.replace(config(out, ("0", "1", "2", "3")), eval_base=False), runner=RecordingRunnerForTests()
    ).run()
    assert list(asked[1]) == ["sft", "local", "pipe"]


def test_one_gpu_runs_pairs_in_turn_on_the_whole_card(tmp_path: Path) -> None:
    runner = RecordingRunnerForTests(0.1)
    Loop(config(tmp_path / "loop", ("3",), until="sft"), runner=runner).run()
    assert not runner.overlap("a1", "a2")
    assert runner.runs["a1"].gpus == runner.runs["a2"].gpus == ("3",)


def test_cpu_profile_places_nothing(tmp_path: Path) -> None:
    cfg = LoopConfig(golden=SAMPLE, out=tmp_path / "l", profile="cpu-smoke", pi1_sft=None, pi2_sft=None,
                     base_model="/base", until="sft")  # fmt: skip
    runner = RecordingRunnerForTests(0.01)
    Loop(cfg, runner=runner).run()
    assert runner.runs["a1"].gpus == () and runner.runs["a1"].overrides == ()


def test_until_names_a_part_of_the_loop() -> None:
    with pytest.raises(ValueError, match="until: must be one of"):
        config(Path("/tmp/x"), ("0",), until="b1")


def test_loop_cli_names_bad_gpu_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from trainer.cli import app
    from trainer.serving import gpus

    monkeypatch.setattr(gpus, "_nvidia_smi_count", lambda: 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    base = ["loop", "--golden", str(SAMPLE), "--out", str(tmp_path), "--profile", "gpu", "--base-model", "/b"]
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 2 and "no GPU found" in res.output
    res = CliRunner().invoke(app, [*base, "--gpus", "0,0"])
    assert res.exit_code == 2 and "distinct" in res.output
    res = CliRunner().invoke(app, [*base, "--gpus", "0", "--until", "b1"])
    assert res.exit_code == 2 and "--until" in res.output


def test_preflight_stops_the_loop_before_a_phase_whose_groups_teach_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.checks import preflight
    from trainer.serving.endpoint import Endpoint
    from trainer.serving.executors import ExecutorPool

    out = tmp_path / "loop"
    for p in ("a1", "a2"):
        recorded_as_run(config(out, ("0",)), p, "/base")
    seen: list[tuple[object, ...]] = []

    def fake_check(golden: Path, reward: str, url: str, model: str, reward_url: str, **kw: object):  # type: ignore[no-untyped-def]
        seen.append((reward, reward_url, float(kw["min_informative"]), kw["n"], kw["prompts"]))  # type: ignore[arg-type]
        return preflight.PreflightReport(reward, 32, 8, 1.0, 2, 0.0625, 0.9, 0.01, 0.25, False)

    monkeypatch.setattr(preflight, "advantage_check", fake_check)
    served = Endpoint("http://127.0.0.1:1", "policy")
    monkeypatch.setattr(ExecutorPool, "ensure", lambda _pool, specs: [served for _ in specs])
    cfg = config(out, ("0",))
    cfg = LoopConfig(**{**cfg.__dict__, "preflight_min": 0.25})
    runner = RecordingRunnerForTests(0.01)
    with pytest.raises(RuntimeError, match=r"phase b1: TOO LITTLE SIGNAL: .*only 2/32 groups .* GRPO would learn"):
        Loop(cfg, runner=runner).run()
    size = preflight.PreflightSize()  # the one preflight size, the loop's default as the experiments'
    assert "b1" not in runner.runs and seen == [("schema", "http://127.0.0.1:9", 0.25, size.n, size.prompts)]
    assert json.loads((out / "b1" / "preflight.json").read_text())["ok"] is False

    # groups that differ are not enough; no sample beating the greedy answer is no headroom
    def no_headroom(golden: Path, reward: str, url: str, model: str, reward_url: str, **kw: object):  # type: ignore[no-untyped-def]
        outcomes = [preflight.PromptOutcome(f"e2e-{i}", 1.0, (1.0, 0.5), (True, True)) for i in range(8)]
        return preflight.build_report(reward, outcomes, 1.0, min_informative=0.25)

    monkeypatch.setattr(preflight, "advantage_check", no_headroom)
    with pytest.raises(RuntimeError, match=r"phase b1: NO HEADROOM: .* 0% of prompts .* < 10%"):
        Loop(cfg, runner=runner).run()
    assert "b1" not in runner.runs
    saved = json.loads((out / "b1" / "preflight.json").read_text())
    assert saved["informative_share"] == 1.0 and saved["headroom"] is False and saved["ok"] is False


def test_loop_cli_passes_the_c2_sample_and_executor_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tests.trainer.test_run_cli import capture_loop_configs
    from trainer.cli import app

    seen = capture_loop_configs(monkeypatch)
    base = ["loop", "--golden", str(SAMPLE), "--out", str(tmp_path), "--profile", "gpu", "--base-model", "/b"]
    res = CliRunner().invoke(app, [*base, "--gpus", "0,1", "--c2-train-prompts", "4096", "trainer.x=1"])
    assert res.exit_code == 0, res.output
    assert seen[-1].c2_train_prompts == 4096 and seen[-1].executor_eager and seen[-1].rl_extra == ("trainer.x=1",)
    assert seen[-1].rl_sources == ()
    res = CliRunner().invoke(app, [*base, "--gpus", "0", "--rl-sources", "wikitabletext, e2e"])
    assert res.exit_code == 0 and seen[-1].rl_sources == ("wikitabletext", "e2e")
    res = CliRunner().invoke(app, [*base, "--gpus", "0", "--executor-cuda-graphs"])
    assert res.exit_code == 0 and seen[-1].executor_eager is False and seen[-1].c2_train_prompts == 4096
    res = CliRunner().invoke(app, [*base, "--gpus", "0", "--c2-train-prompts", "0"])
    assert res.exit_code == 2 and "--c2-train-prompts" in res.output


def test_parts_record_their_wall_time_once(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    Loop(config(out, ("0", "1"), until="sft"), runner=RecordingRunnerForTests(0.2)).run()
    first = json.loads((out / RECORD).read_text())["parts"]["sft"]
    assert 0.2 <= first["seconds"] < 30 and first["status"] == "ok"
    Loop(config(out, ("0", "1"), until="sft"), runner=RecordingRunnerForTests(0.2)).run()  # skipped: kept
    assert json.loads((out / RECORD).read_text())["parts"]["sft"] == first
    assert "| sft | ok |" in (out / "report.md").read_text()


def test_phase_d_on_gpus_serves_the_settings_in_waves_that_give_their_gpus_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two GPUs, four settings: two waves of two settings, a GPU each; a wave's executors start together and stop
    before the next wave's start (they would share its GPUs); each setting's Stage 2 sees its own π2."""
    from typing import Any

    from trainer.serving.endpoint import Endpoint
    from trainer.serving.executors import ExecutorPool

    events: list[tuple[str, ...]] = []

    def ensure(pool: ExecutorPool, specs: Any) -> list[Endpoint]:
        events.append(("start", *(f"{s.model}@{','.join(s.slot.gpus)}" for s in specs)))
        return [Endpoint(f"http://{s.model.strip('/')}", "policy") for s in specs]

    def stop_except(pool: ExecutorPool, keep: Any = ()) -> list[str]:
        events.append(("stop",))
        return []

    def stage1_schemas(_label: str, pi1: str, examples: Any, serve: Any, *_a: Any, **_kw: Any) -> list[str]:
        with serve(pi1, "stage1") as ep:
            return [ep.url for _ in examples]

    tables_by: dict[str, str] = {}

    def run_two_stage(
        name: str, _p1: str, pi2: str, examples: Any, serve: Any, *_a: Any, schemas: Any, **_kw: Any
    ) -> Any:
        with serve(pi2, "stage2") as ep:
            tables_by[name] = ep.url
            return [{"id": ex.id, "schema_prediction": "{}", "table_prediction": None} for ex in examples]

    monkeypatch.setattr(ExecutorPool, "ensure", ensure)
    monkeypatch.setattr(ExecutorPool, "stop_except", stop_except)
    monkeypatch.setattr("trainer.evaluation.two_stage.stage1_schemas", stage1_schemas)
    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", run_two_stage)
    cfg = dataclasses.replace(config(tmp_path / "loop", ("0", "1")), eval_limit=2)
    settings = {name: (f"/{name}1", f"/{name}2") for name in ("base", "sft", "local", "pipe")}
    Loop(cfg).evaluate(settings, "loop1", ("local", "pipe"))
    assert events == [
        ("start", "/base1@0", "/base2@0", "/sft1@1", "/sft2@1"), ("stop",),
        ("start", "/local1@0", "/local2@0", "/pipe1@1", "/pipe2@1"), ("stop",),
    ]  # fmt: skip
    assert tables_by == {n: f"http://{n}2" for n in settings}
    assert set(json.loads((tmp_path / "loop" / "eval_loop1" / "metrics.json").read_text())["settings"]) == set(settings)

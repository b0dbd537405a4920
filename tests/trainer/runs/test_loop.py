"""Loop orchestration: resume from recorded phase outputs, manifest contents, failure surfaced."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs.c2_data import PRECOMPUTE_KEY, precompute_key
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop, redecide
from trainer.runs.phase_d_part import EVAL_KEY
from trainer.runs.record import RECORD
from trainer.runs.reuse import PHASE_INPUTS, StaleResultError, phase_inputs, run_inputs
from trainer.runs.reuse import finished as phase_done
from trainer.runs.reuse import record as record_inputs
from trainer.serving.endpoint import Endpoint
from trainer.serving.identity import ServedModelMismatch, fingerprint, short
from trainer.serving.reward_api import reward_api_process

SAMPLE = Path(__file__).resolve().parents[3] / "trainer" / "data" / "sample"


def recorded(out_dir: Path, phase: str, hf: Path) -> PhaseResult:
    """A finished phase as `run_phase` records it (result JSON + exported model directory)."""
    hf.mkdir(parents=True, exist_ok=True)
    res = PhaseResult(phase, "cpu-smoke", "ok", 0, ["cmd"], "/start", "/data", str(out_dir), "t", 1.0,
                      best_step=2, hf_dir=str(hf))  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    res.write(out_dir)
    return res


def recorded_as_run(
    cfg: LoopConfig, phase: str, model: str, hf: Path | None = None, out_dir: Path | None = None,
    data_dir: Path | None = None, reward_model: str | None = None,
) -> PhaseResult:  # fmt: skip
    """A phase the loop of ``cfg`` finished from ``model``: its result, its export (``hf``, default its folder's) and
    the inputs the loop records beside them (on the data the loop builds, which is built first)."""
    loop = Loop(cfg)
    loop.build_data()
    out_dir = out_dir or loop.out / phase
    run = loop.run_of(phase, model, out_dir, data_dir, reward_model=reward_model)
    res = recorded(out_dir, phase, hf or out_dir / "hf")
    record_inputs(out_dir, run_inputs(run))
    return res


class FaultyPhaseRunner:
    """Injects a training failure (exit 1) into whatever phase the loop launches."""

    def __init__(self) -> None:
        self.launched: list[PhaseRun] = []

    def __call__(self, run: PhaseRun) -> PhaseResult:
        self.launched.append(run)
        return PhaseResult(run.phase.name, run.profile, "failed", 1, run.command(), run.model_path,
                           str(run.data_dir), str(run.out_dir), "t", 0.1, error="reward down")  # fmt: skip


def test_phase_done_requires_ok_and_export(tmp_path: Path) -> None:
    assert phase_done(tmp_path / "b1") is None
    recorded(tmp_path / "b1", "b1", tmp_path / "b1" / "hf")
    assert phase_done(tmp_path / "b1") is not None
    (tmp_path / "b1" / "hf").rmdir()
    assert phase_done(tmp_path / "b1") is None


@contextlib.contextmanager
def c1_reward_api(tmp_path: Path, pi2: Path) -> Iterator[str]:
    """A real reward API whose executor model name carries π2's content hash."""
    executor = Endpoint("http://127.0.0.1:9", f"pi2-{short(fingerprint(pi2))}")
    with reward_api_process(tmp_path / "c1_api.log", executors=[executor]) as api:
        yield api.url


@pytest.mark.service
def test_loop_resumes_and_records_manifest(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    cfg = LoopConfig(
        golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/pi1s", pi2_sft="/pi2s",
        reward_url="http://127.0.0.1:9", rl_extra=("x=1",),
    )  # fmt: skip
    recorded_as_run(cfg, "b1", "/pi1s")  # the reward APIs' URLs are no inputs
    recorded_as_run(cfg, "b2", "/pi2s")
    runner = FaultyPhaseRunner()
    with c1_reward_api(tmp_path, out / "b2" / "hf") as c1_url:
        cfg = dataclasses.replace(cfg, c1_reward_url=c1_url)
        with pytest.raises(RuntimeError, match=r"phase c1 failed \(exit 1\): reward down"):
            Loop(cfg, runner=runner).run()
    # B1/B2 were skipped (recorded outputs exist); C1 started from π1ʳ-local with the C1 reward URL.
    assert [r.phase.name for r in runner.launched] == ["c1"]
    c1 = runner.launched[0]
    assert c1.model_path == str(out / "b1" / "hf") and c1.reward_url == c1_url
    assert c1.overrides == ("x=1",) and c1.data_dir == out / "data"
    m = json.loads((out / RECORD).read_text())
    assert m["phases"]["b1"]["status"] == "ok" and m["phases"]["b2"]["status"] == "ok"
    assert m["phases"]["c1"]["status"] == "failed"
    assert set(m["inputs"]["golden"]) == {str(p) for p in SAMPLE.glob("common_*_schemas.jsonl")}
    assert "c1_grpo.yaml" in m["inputs"]["configs"] and "profile/cpu-smoke.yaml" in m["inputs"]["configs"]
    assert m["data"]["counts"]["c1"] == {"train": 12, "validation": 6}
    assert m["served:c1_loop1"]["served_name"].startswith("pi2-")  # what the C1 reward API really served
    # C1 recorded now -> a rerun goes straight to precompute (which needs π1ʳ-pipe served)
    recorded_as_run(cfg, "c1", str(out / "b1" / "hf"), reward_model=str(out / "b2" / "hf"))
    (out / "data" / "c2").mkdir(parents=True)
    (out / "data" / "c2" / "train.parquet").write_bytes(b"")  # precompute output recorded, with its key
    key = precompute_key(cfg, str(out / "c1" / "hf"), "gold")
    (out / "data" / "c2" / PRECOMPUTE_KEY).write_text(json.dumps(key))
    runner2 = FaultyPhaseRunner()
    with c1_reward_api(tmp_path, out / "b2" / "hf") as c1_url2, pytest.raises(RuntimeError, match="phase c2 failed"):
        Loop(dataclasses.replace(cfg, c1_reward_url=c1_url2), runner=runner2).run()
    assert [r.phase.name for r in runner2.launched] == ["c2"]
    assert runner2.launched[0].model_path == str(out / "b2" / "hf")


def test_loop_runs_sft_first_without_sft_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    cfg = LoopConfig(
        golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft=None, pi2_sft=None, base_model="/base",
        sft_overrides=("optim.lr=1e-4",), reward_url="http://127.0.0.1:9", rl_extra=("x=1",),
    )  # fmt: skip
    recorded_as_run(cfg, "a1", "/base")
    runner = FaultyPhaseRunner()
    with pytest.raises(RuntimeError, match=r"phase a2 failed \(exit 1\)"):
        Loop(cfg, runner=runner).run()
    # A1 was recorded, so only A2 ran: from the base model, with the SFT overrides and no reward URL.
    assert [r.phase.name for r in runner.launched] == ["a2"]
    a2 = runner.launched[0]
    assert (a2.model_path, a2.overrides, a2.reward_url) == ("/base", ("optim.lr=1e-4",), None)
    m = json.loads((out / RECORD).read_text())
    assert m["data"]["counts"]["a1"] == {"train": 12, "validation": 6} and "a2" in m["data"]["counts"]
    assert m["config"]["base_model"] == "/base" and m["phases"]["a2"]["status"] == "failed"
    # With A2 recorded too, B1 starts from the A1 export with the RL overrides.
    recorded_as_run(cfg, "a2", "/base")
    runner2 = FaultyPhaseRunner()
    with pytest.raises(RuntimeError, match="phase b1 failed"):
        Loop(cfg, runner=runner2).run()
    b1 = runner2.launched[0]
    assert (b1.phase.name, b1.model_path, b1.overrides) == ("b1", str(out / "a1" / "hf"), ("x=1",))


def test_loop_without_sft_or_base_model_names_the_phase(tmp_path: Path) -> None:
    cfg = LoopConfig(golden=SAMPLE, out=tmp_path / "l", profile="gpu", pi1_sft="/pi1s", pi2_sft=None)
    with pytest.raises(ValueError, match="a2: no SFT checkpoint given and no base model"):
        Loop(cfg, runner=FaultyPhaseRunner()).run()


def test_rft_baseline_trains_from_the_sft_policies_on_kept_samples(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    # sampling for both rewards already recorded (its parquet exists), so only the RFT SFT runs launch
    for reward, phase in (("schema", "a1"), ("table", "a2")):
        (out / "rft" / reward / "data" / phase).mkdir(parents=True)
        (out / "rft" / reward / "data" / phase / "train.parquet").write_bytes(b"")
    cfg = LoopConfig(
        golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/pi1s", pi2_sft="/pi2s", rft=True,
        sft_overrides=("optim.lr=1e-4",), reward_url="http://127.0.0.1:9",
    )  # fmt: skip
    schema = out / "rft" / "schema"
    recorded_as_run(cfg, "a1", "/pi1s", out_dir=schema / "sft", data_dir=schema / "data")
    runner = FaultyPhaseRunner()
    with pytest.raises(RuntimeError, match=r"phase rft/table/sft failed"):
        Loop(cfg, runner=runner).run()
    [a2] = runner.launched
    assert (a2.phase.name, a2.model_path, a2.data_dir) == ("a2", "/pi2s", out / "rft" / "table" / "data")
    assert a2.overrides == ("optim.lr=1e-4",)
    m = json.loads((out / RECORD).read_text())
    assert (m["config"]["rft_k"], m["config"]["rft_threshold"]) == (4, 0.5)
    assert m["phases"]["rft/schema/sft"]["status"] == "ok"


def test_recorded_phase_d_gets_the_current_decision_rule(tmp_path: Path) -> None:
    settings = {n: {"overall": {"cell_accuracy": v}, "per_source": {}} for n, v in
                (("sft", 0.5), ("local", 0.5), ("pipe", 0.6), ("rft", 0.2))}  # fmt: skip
    stale = {"decision": "stop", "previous": "pipe", "last": "rft"}
    recorded = {"prompt_version": "v", "settings": settings, "loop2": stale}
    (tmp_path / "metrics.json").write_text(json.dumps(recorded))
    d = redecide(tmp_path, recorded, "Phase D", "cell_accuracy", 1.0, ("local", "pipe"))
    assert (d["previous"], d["last"], d["decision"]) == ("local", "pipe", "continue")
    assert json.loads((tmp_path / "metrics.json").read_text())["loop2"] == d
    assert "pipe vs local: +10.00 points" in (tmp_path / "report.md").read_text()


@pytest.mark.service
def test_c1_reward_url_serving_another_pi2_stops_the_loop_before_c1(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    stale = tmp_path / "yesterdays_pi2"
    stale.mkdir()
    runner = FaultyPhaseRunner()
    with c1_reward_api(tmp_path, stale) as c1_url:  # the fault: the cluster still serves another π2
        cfg = LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/pi1s", pi2_sft="/pi2s",
                         reward_url="http://127.0.0.1:9", c1_reward_url=c1_url)  # fmt: skip
        recorded_as_run(cfg, "b1", "/pi1s")
        recorded_as_run(cfg, "b2", "/pi2s")
        (out / "b2" / "hf" / "model.safetensors").write_bytes(b"pi2-local")
        with pytest.raises(ServedModelMismatch, match=rf"expects {out / 'b2' / 'hf'} \(fingerprint"):
            Loop(cfg, runner=runner).run()
    assert runner.launched == []


def test_precompute_and_phase_d_are_reused_only_for_the_same_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resume keys on content: a new π1ʳ-pipe (same folder, new weights) or a changed golden file means recompute."""
    out, golden = tmp_path / "loop", tmp_path / "golden"
    golden.mkdir()
    for f in SAMPLE.glob("common_*_schemas.jsonl"):
        (golden / f.name).write_bytes(f.read_bytes())
    pi1 = tmp_path / "c1_hf"
    pi1.mkdir()
    (pi1 / "model.safetensors").write_bytes(b"v1")
    cfg = LoopConfig(golden=golden, out=out, profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b")
    loop = Loop(cfg)
    key = precompute_key(loop.cfg, str(pi1), "gold")
    (pi1 / "model.safetensors").write_bytes(b"v2")  # C1 ran again
    assert precompute_key(loop.cfg, str(pi1), "gold") != key
    settings = {"pipe": (str(pi1), "/b")}
    ekey = loop.eval_key(settings)
    assert loop.eval_key(settings) == ekey
    # a Phase D served another way (CUDA graphs) is not the same evaluation
    assert Loop(dataclasses.replace(cfg, executor_eager=not cfg.executor_eager)).eval_key(settings) != ekey
    with (golden / "common_test_schemas.jsonl").open("a") as fh:
        fh.write("\n")
    assert loop.eval_key(settings) != ekey

    # a recorded Phase D with a stale key is not reused: evaluation runs again (here: serving π1 fails)
    ev = out / "eval_loop1"
    ev.mkdir(parents=True)
    (ev / "metrics.json").write_text(json.dumps({"settings": {"pipe": {}}, "loop2": {}}))
    (ev / EVAL_KEY).write_text(json.dumps(ekey))
    calls: list[str] = []

    def score_failing(_ctx: object, scored: dict[str, tuple[str, str]], *_a: object, **_k: object) -> Any:
        calls.extend(scored)
        raise RuntimeError("re-evaluated")

    monkeypatch.setattr("trainer.runs.phase_d_part.score", score_failing)
    with pytest.raises(RuntimeError, match="re-evaluated"):
        loop.evaluate(settings, "loop1", ("pipe", "pipe"))
    assert calls == ["pipe"]


def test_a_phase_result_from_other_inputs_is_not_reused(tmp_path: Path) -> None:
    """C2 recorded, then the precompute ran again (new C2 data): the loop stops instead of reusing C2."""

    out = tmp_path / "loop"
    loop = Loop(LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b"),
                runner=FaultyPhaseRunner())  # fmt: skip
    (loop.data / "c2").mkdir(parents=True)
    (loop.data / "c2" / "train.parquet").write_bytes(b"schemas of the first pi1-pipe")
    recorded(out / "c2", "c2", out / "c2" / "hf")
    (out / "c2" / PHASE_INPUTS).write_text(json.dumps(phase_inputs("c2", "/b2", loop.data, "cpu-smoke")))
    assert loop.phase("c2", "/b2", "http://127.0.0.1:9", out / "c2") == str(out / "c2" / "hf")  # same inputs: reused
    (loop.data / "c2" / "train.parquet").write_bytes(b"schemas of a new pi1-pipe")
    with pytest.raises(StaleResultError, match=r"phase c2: its recorded result was trained from other inputs"):
        loop.phase("c2", "/b2", "http://127.0.0.1:9", out / "c2")
    assert loop.runner.launched == []  # type: ignore[attr-defined]


def test_c1_trained_against_another_frozen_pi2_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """C1's pipeline reward runs π2ʳ-local: a C1 recorded against one π2 stops the pipeline round when B2 has since
    produced another one, before any server starts (the reward API's URL is no input)."""

    out = tmp_path / "loop"
    loop = Loop(LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b"),
                runner=FaultyPhaseRunner())  # fmt: skip
    pi2 = tmp_path / "b2_hf"
    pi2.mkdir()
    (pi2 / "model.safetensors").write_bytes(b"the first pi2-local")
    recorded(out / "c1", "c1", out / "c1" / "hf")
    inputs = phase_inputs("c1", "/b1", loop.data, "cpu-smoke", reward_model=str(pi2))
    (out / "c1" / PHASE_INPUTS).write_text(json.dumps(inputs))
    assert inputs["reward_model"] == fingerprint(str(pi2))
    assert loop.phase("c1", "/b1", "http://127.0.0.1:9", out / "c1", reward_model=str(pi2)) == str(out / "c1" / "hf")
    (pi2 / "model.safetensors").write_bytes(b"B2 trained again")
    with pytest.raises(StaleResultError, match=r"phase c1: .*other inputs \(reward_model: recorded "):
        loop.pipeline_round("/b1", str(pi2), "loop1")
    assert loop.runner.launched == []  # type: ignore[attr-defined]
    # the round names its frozen π2 to C1, as an input of the run it launches
    asked: list[tuple[str, str | None]] = []

    def c1_stopping_the_round(run: PhaseRun, *_a: object) -> str:
        asked.append((run.phase.name, run.reward_model))
        raise RuntimeError("stop at C1's launch")

    monkeypatch.setattr(loop, "c1", c1_stopping_the_round)
    with pytest.raises(RuntimeError, match="stop at C1's launch"):
        loop.pipeline_round("/b1", "/pi2-local", "loop2")
    assert asked == [("c1", "/pi2-local")]


def test_a_phase_trained_with_other_overrides_profile_or_config_is_not_reused(tmp_path: Path) -> None:
    """A1 recorded with 4 SFT steps; a rerun asking for 6 must not reuse it (the manifest would show 6 beside a
    command that says 4), and neither may a rerun with another profile or an edited config file."""
    from trainer.runs.reuse import inputs_difference

    out = tmp_path / "loop"
    cfg = LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", sft_overrides=("trainer.total_training_steps=4",))
    loop = Loop(cfg, runner=FaultyPhaseRunner())
    recorded(out / "a1", "a1", out / "a1" / "hf")
    four = phase_inputs("a1", "/base", loop.data, "cpu-smoke", ("trainer.total_training_steps=4",))
    (out / "a1" / PHASE_INPUTS).write_text(json.dumps(four))
    assert loop.phase("a1", "/base", None, out / "a1") == str(out / "a1" / "hf")  # same inputs: reused
    six = Loop(dataclasses.replace(cfg, sft_overrides=("trainer.total_training_steps=6",)), runner=FaultyPhaseRunner())
    with pytest.raises(StaleResultError, match=r"overrides: recorded \['trainer.total_training_steps=4'\], now "
                                               r"\['trainer.total_training_steps=6'\]"):  # fmt: skip
        six.phase("a1", "/base", None, out / "a1")
    assert six.runner.launched == []  # type: ignore[attr-defined]
    gpu = phase_inputs("a1", "/base", loop.data, "gpu", ("trainer.total_training_steps=4",))
    assert inputs_difference(four, gpu).startswith("configs: ") and "profile: recorded 'cpu-smoke', now 'gpu'" in (
        inputs_difference(four, gpu))
    edited = {**four, "configs": {**four["configs"], "a1_sft.yaml": "0" * 64}}
    assert inputs_difference(edited, four).startswith("configs: recorded")


def test_rl_sources_train_a_grpo_phase_on_those_sources_and_key_its_result(tmp_path: Path) -> None:
    """--rl-sources: the phase's train split of those sources (train_sets/, before the user's overrides), in
    the run record and in the phase's recorded inputs (the set by content), so a result trained on every source is
    not reused."""
    import pyarrow.parquet as pq

    from shared.golden import source_of
    from trainer.data.datasets import build_datasets

    out = tmp_path / "loop"
    cfg = LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b",
                     rl_sources=("people", "invoice"), rl_extra=("x=1",))  # fmt: skip
    loop = Loop(cfg, runner=FaultyPhaseRunner())
    build_datasets(SAMPLE, loop.data, ["b1"])
    with pytest.raises(RuntimeError, match="phase b1 failed"):
        loop.phase("b1", "/a", "http://127.0.0.1:9", out / "b1")
    train = out / "train_sets" / "b1_people+invoice.parquet"
    assert loop.runner.launched[0].overrides == (f"data.train_files={train}", "x=1")  # type: ignore[attr-defined]
    ids = [r["id"] for r in pq.read_table(train).column("extra_info").to_pylist()]
    assert len(ids) == 8 and {source_of(i) for i in ids} == {"people", "invoice"}
    assert json.loads((out / RECORD).read_text())["train_set:b1"]["prompts"] == 8
    assert run_inputs(loop.runner.launched[0])["train_files"]  # type: ignore[attr-defined]  # the set, by content
    recorded(out / "b1", "b1", out / "b1" / "hf")
    every_source = phase_inputs("b1", "/a", loop.data, "cpu-smoke", ("x=1",))
    (out / "b1" / PHASE_INPUTS).write_text(json.dumps(every_source))
    with pytest.raises(StaleResultError, match="trained from other inputs"):
        loop.phase("b1", "/a", "http://127.0.0.1:9", out / "b1")
    every = Loop(dataclasses.replace(cfg, rl_sources=()), runner=FaultyPhaseRunner())
    assert every.phase("b1", "/a", "http://127.0.0.1:9", out / "b1") == str(out / "b1" / "hf")  # reused
    assert precompute_key(loop.cfg, "/c1", "gold")["config"]["train_sources"] == ["people", "invoice"]
    assert precompute_key(every.cfg, "/c1", "gold")["config"]["train_sources"] == []


class WaitingRunnerForTests:
    """Plays the C1 trainer against the real services the loop starts beside it: at launch it looks whether
    the reward API already answers, then waits for it as PhaseTrainer does (trainer/phase_rules/reward_ready.py)
    and 'trains' (a recorded result) once it can score, or fails as the phase would."""

    def __init__(self) -> None:
        self.ready_at_launch: bool | None = None
        self.waited_s: float | None = None
        self.error: str | None = None

    def __call__(self, run: PhaseRun) -> PhaseResult:
        from trainer.phase_rules.reward_ready import ABORT_FILE, check_once, wait_for_reward_api

        assert run.reward_url
        self.ready_at_launch = check_once(run.reward_url, pipeline=True).ready
        try:
            self.waited_s = wait_for_reward_api(
                run.reward_url, pipeline=True, timeout_s=600, abort_file=run.out_dir / ABORT_FILE, poll_s=0.5
            )
        except RuntimeError as exc:
            self.error = str(exc)
            return PhaseResult(run.phase.name, run.profile, "failed", 1, run.command(), run.model_path,
                               str(run.data_dir), str(run.out_dir), "t", 0.1, error=self.error)  # fmt: skip
        return recorded(run.out_dir, run.phase.name, run.out_dir / "hf")


def c1_config(out: Path) -> LoopConfig:
    return LoopConfig(
        golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/pi1s", pi2_sft="/pi2s",
        reward_url="http://127.0.0.1:9", until="c1",
    )  # fmt: skip


@pytest.mark.service
def test_c1_starts_beside_its_executors_and_waits_for_them(tmp_path: Path, default_model_dir: Path) -> None:
    out = tmp_path / "loop"
    recorded_as_run(c1_config(out), "b1", "/pi1s")
    # π2ʳ-local: a real model the vLLM-CPU executor serves
    recorded_as_run(c1_config(out), "b2", "/pi2s", hf=default_model_dir)
    runner = WaitingRunnerForTests()
    manifest = Loop(c1_config(out), runner=runner).run()
    assert manifest["stopped_after"] == "c1" and runner.error is None
    # launched before the reward API and its executor answered, and waited until they did
    assert runner.ready_at_launch is False and runner.waited_s is not None and runner.waited_s > 1.0
    services = manifest["services:c1_loop1"]
    assert services["beside_trainer"] and services["ready_s"] > 1.0
    assert not (out / "c1" / "reward_api_failed.txt").exists()
    # a rerun with C1 recorded trains nothing (the faulty runner would fail it) and starts no services
    api_log = out / "logs" / "reward_api_c1_loop1.log"
    size = api_log.stat().st_size
    manifest = Loop(dataclasses.replace(c1_config(out), until="c1"), runner=FaultyPhaseRunner()).run()
    assert manifest["stopped_after"] == "c1" and api_log.stat().st_size == size


@pytest.mark.service
def test_c1_services_that_fail_to_start_stop_the_trainer_at_once_and_are_the_named_cause(tmp_path: Path) -> None:
    out = tmp_path / "loop"
    recorded_as_run(c1_config(out), "b1", "/pi1s")
    recorded_as_run(c1_config(out), "b2", "/pi2s")  # the fault: an empty folder, no model for vLLM to serve
    runner = WaitingRunnerForTests()
    with pytest.raises(RuntimeError, match=r"c1_loop1: the reward API and executors of .*b2/hf failed to start") as err:
        Loop(c1_config(out), runner=runner).run()
    assert runner.error is not None and "its services failed to start" in runner.error  # not the 600 s deadline
    assert isinstance(err.value.__context__, RuntimeError) and "phase c1 failed" in str(err.value.__context__)
    assert err.value.__cause__ is not None  # the executor's own start error
    assert (out / "c1" / "reward_api_failed.txt").is_file()


def test_abort_file_name_is_the_one_grpo_base_gives_the_trainer() -> None:
    import yaml

    from trainer.phase_rules.reward_ready import ABORT_FILE

    base = Path(__file__).resolve().parents[3] / "trainer" / "phases" / "configs" / "grpo_base.yaml"
    cfg = yaml.safe_load(base.read_text())
    assert cfg["reward_ready"]["abort_file"] == "${oc.env:TRAINER_OUT_DIR}/" + ABORT_FILE


def phase_d_on_recorded_stages(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ensure: Any, stage1_schemas: Any, run_two_stage: Any
) -> LoopConfig:
    """The loop's Phase D with the executors' start and both prompt stages replaced by the test's recorders; the
    loop's config."""
    from trainer.serving.executors import ExecutorPool

    monkeypatch.setattr(ExecutorPool, "ensure", ensure)
    monkeypatch.setattr("trainer.evaluation.two_stage.stage1_schemas", stage1_schemas)
    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", run_two_stage)
    return LoopConfig(golden=SAMPLE, out=tmp_path / "loop", profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b")


def test_phase_d_serves_without_prefix_caching_and_records_the_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's Phase-D executors run eager without prefix caching (the mode that repeats); metrics.json and
    report.md record it per setting, and a decision taken again over the recorded scores keeps the line."""
    from trainer.serving.endpoint import ServingMode
    from trainer.serving.executors import ExecutorPool

    asked: list[dict[str, object]] = []
    mode = ServingMode("CPU", eager=True, prefix_caching=True, batch_invariant=False)

    def ensure(pool: ExecutorPool, specs: Any) -> list[Endpoint]:
        asked.append({"eager": pool.eager, "prefix_caching": pool.prefix_caching, "models": [s.model for s in specs]})
        return [Endpoint("http://127.0.0.1:9", "policy", mode=mode) for _ in specs]

    def stage1_schemas(_label: str, pi1: str, examples: Any, serve: Any, *_a: Any, **_kw: Any) -> list[str]:
        with serve(pi1, "stage1"):
            return [json.dumps(ex.schema_dict()) for ex in examples]

    def run_two_stage(
        _name: str, _pi1: str, pi2: str, examples: Any, serve: Any, *_a: Any, schemas: list[str], **_kw: Any
    ) -> list[dict[str, Any]]:
        with serve(pi2, "stage2"):
            pass
        return [{"id": ex.id, "schema_prediction": s, "table_prediction": None}
                for ex, s in zip(examples, schemas, strict=True)]  # fmt: skip

    cfg = phase_d_on_recorded_stages(monkeypatch, tmp_path, ensure, stage1_schemas, run_two_stage)
    settings = {"sft": ("/a", "/b"), "pipe": ("/c", "/b")}
    Loop(cfg).evaluate(settings, "loop1", ("sft", "pipe"))
    # one model at a time on CPU: π1 then π2 of each setting, each served eager without prefix caching
    assert [a["models"] for a in asked] == [["/a"], ["/b"], ["/c"], ["/b"]]
    assert all(a["prefix_caching"] is False and a["eager"] is True for a in asked)
    out = tmp_path / "loop" / "eval_loop1"
    serving = json.loads((out / "metrics.json").read_text())["serving"]
    want = {**mode.as_dict(), "concurrency": cfg.eval_concurrency, "max_tokens": cfg.eval_max_tokens}
    assert serving["sft"] == serving["pipe"] == want
    line = next(ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("Serving: "))
    Loop(cfg).evaluate(settings, "loop1", ("pipe", "sft"))  # reused, decided again
    assert len(asked) == 4 and json.loads((out / "metrics.json").read_text())["loop2"]["last"] == "sft"
    assert line in (out / "report.md").read_text().splitlines()


def test_phase_d_cut_in_stage_2_keeps_stage_1_for_the_resumed_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Phase D cut during a setting's Stage 2 (the allocation ended) keeps that setting's Stage-1 schemas under
    their key: the resumed loop scores the same schemas without running π1 again; a new π1 runs it again."""
    from trainer.serving.endpoint import ServingMode
    from trainer.serving.executors import ExecutorPool

    pi1 = tmp_path / "c1_hf"
    pi1.mkdir()
    (pi1 / "model.safetensors").write_bytes(b"v1")
    stage1_runs: list[str] = []
    cut = {"on": True}

    def ensure(_pool: ExecutorPool, specs: Any) -> list[Endpoint]:
        mode = ServingMode("CPU", eager=True, prefix_caching=False)
        return [Endpoint("http://127.0.0.1:9", "policy", mode=mode) for _ in specs]

    def stage1_schemas(label: str, pi1_dir: str, examples: Any, serve: Any, *_a: Any, **_kw: Any) -> list[str]:
        stage1_runs.append(label)
        with serve(pi1_dir, "stage1"):
            return [json.dumps(ex.schema_dict()) + " " * len(stage1_runs) for ex in examples]  # which run wrote it

    def run_two_stage(
        _n: str, _p1: str, _p2: str, examples: Any, *_a: Any, schemas: list[str], **_kw: Any
    ) -> list[dict[str, Any]]:
        if cut["on"]:
            raise RuntimeError("the allocation ended")
        return [{"id": ex.id, "schema_prediction": s, "table_prediction": None}
                for ex, s in zip(examples, schemas, strict=True)]  # fmt: skip

    cfg = phase_d_on_recorded_stages(monkeypatch, tmp_path, ensure, stage1_schemas, run_two_stage)
    settings = {"pipe": (str(pi1), "/b")}
    with pytest.raises(RuntimeError, match="the allocation ended"):
        Loop(cfg).evaluate(settings, "loop1", ("pipe", "pipe"))
    kept = tmp_path / "loop" / "stage1_cache" / "pipe.json"
    assert stage1_runs == ["pipe"] and kept.is_file()
    cut["on"] = False
    Loop(cfg).evaluate(settings, "loop1", ("pipe", "pipe"))
    assert stage1_runs == ["pipe"]  # Stage 1 did not run again
    preds = (tmp_path / "loop" / "eval_loop1" / "predictions_pipe.jsonl").read_text().splitlines()
    assert preds and all(json.loads(line)["schema_prediction"].endswith(" ") for line in preds)  # the first run's
    (pi1 / "model.safetensors").write_bytes(b"v2")  # π1 trained again: another key
    (tmp_path / "loop" / "eval_loop1" / "metrics.json").unlink()
    Loop(cfg).evaluate(settings, "loop1", ("pipe", "pipe"))
    assert stage1_runs == ["pipe", "pipe"]


def test_rl_mix_share_mixes_a_phases_source_set_and_keys_its_result(tmp_path: Path) -> None:
    """--rl-mix-share: B2's people prompts with invoice and product added evenly to make the share (written
    beside its source set, recorded in the manifest and in the phase's inputs, so a result trained with another
    share is refused naming it); share 0 trains on the source set, byte for byte the one written without it."""
    import hashlib
    from collections import Counter

    import pyarrow.parquet as pq

    from shared.golden import source_of
    from trainer.data.datasets import build_datasets
    from trainer.data.train_set import source_prompt_set

    out = tmp_path / "loop"
    cfg = LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b",
                     rl_sources=("people",), rl_mix_share=0.5)  # fmt: skip
    loop = Loop(cfg, runner=FaultyPhaseRunner())
    build_datasets(SAMPLE, loop.data, ["b2"])
    with pytest.raises(RuntimeError, match="phase b2 failed"):
        loop.phase("b2", "/b", "http://127.0.0.1:9", out / "b2")
    mixed = out / "train_sets" / "b2_people+mix.parquet"
    assert loop.runner.launched[0].overrides == (f"data.train_files={mixed}",)  # type: ignore[attr-defined]
    ids = [r["id"] for r in pq.read_table(mixed).column("extra_info").to_pylist()]
    assert Counter(source_of(i) for i in ids) == {"people": 4, "invoice": 2, "product": 2}
    record = json.loads((out / RECORD).read_text())["train_mix:b2"]
    assert (record["share"], record["seed"], record["prompts"]) == (0.5, 0, {"people": 4, "invoice": 2, "product": 2})
    recorded(out / "b2", "b2", out / "b2" / "hf")
    half = run_inputs(loop.runner.launched[0])  # type: ignore[attr-defined]
    (out / "b2" / PHASE_INPUTS).write_text(json.dumps(half))
    assert loop.phase("b2", "/b", "http://127.0.0.1:9", out / "b2") == str(out / "b2" / "hf")  # same share: reused
    fifth = Loop(dataclasses.replace(cfg, rl_mix_share=0.2), runner=FaultyPhaseRunner())
    with pytest.raises(StaleResultError, match=r"train_files: recorded '[0-9a-f]{64}', now '[0-9a-f]{64}'"):
        fifth.phase("b2", "/b", "http://127.0.0.1:9", out / "b2")
    none = Loop(dataclasses.replace(cfg, rl_mix_share=0.0), runner=FaultyPhaseRunner())
    with pytest.raises(StaleResultError, match=r"train_files: recorded '[0-9a-f]{64}', now '[0-9a-f]{64}'"):
        none.phase("b2", "/b", "http://127.0.0.1:9", out / "b2")
    with pytest.raises(RuntimeError, match="phase b2_again failed"):
        none.phase("b2", "/b", "http://127.0.0.1:9", out / "b2_again")
    source_set = out / "train_sets" / "b2_again_people.parquet"
    assert none.runner.launched[0].overrides == (f"data.train_files={source_set}",)  # type: ignore[attr-defined]
    source_prompt_set(loop.data / "b2" / "train.parquet", ("people",), tmp_path / "today.parquet")
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (source_set, tmp_path / "today.parquet")]
    assert digest[0] == digest[1]
    assert "train_mix:b2_again" not in json.loads((out / RECORD).read_text())

"""trainer/runs/context.py: a phase's result and inputs are recorded the moment it finishes, not after its group, so a
run stopped while another phase of the group trains neither reuses a phase trained from other settings nor loses
one trained from the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.trainer.runs.test_loop import SAMPLE, recorded, recorded_as_run
from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop
from trainer.runs.record import RECORD
from trainer.runs.reuse import PHASE_INPUTS, StaleResultError, run_inputs

FOUR, SIX = "trainer.total_training_steps=4", "trainer.total_training_steps=6"


class LoopKilledForTests(BaseException):
    """The loop's process ending while a phase trains (a BaseException: no ``except Exception`` handles it)."""


class FaultInjectingRunnerKilledAt:
    """'Trains' every phase (an ok result and an export) but ``killed_at``, where the run ends as if killed."""

    def __init__(self, killed_at: str | None) -> None:
        self.killed_at = killed_at
        self.launched: list[PhaseRun] = []

    def __call__(self, run: PhaseRun) -> PhaseResult:
        self.launched.append(run)
        if run.phase.name == self.killed_at:
            (run.out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)  # it had started
            raise LoopKilledForTests(run.phase.name)
        return recorded(run.out_dir, run.phase.name, run.out_dir / "hf")


def sft_config(out: Path, steps: str, gpus: tuple[str, ...]) -> LoopConfig:
    """A1 and A2 from a base model: in turn on CPU, side by side on two GPUs (one group either way)."""
    return LoopConfig(
        golden=SAMPLE, out=out, profile="gpu" if gpus else "cpu-smoke", gpus=gpus, pi1_sft=None, pi2_sft=None,
        base_model="/base", sft_overrides=(steps,), reward_url="http://127.0.0.1:9", until="sft",
    )  # fmt: skip


@pytest.mark.parametrize("gpus", [(), ("0", "1")], ids=["in-turn-cpu", "side-by-side-gpus"])
def test_a_phase_finished_before_the_loop_was_killed_keeps_its_inputs(tmp_path: Path, gpus: tuple[str, ...]) -> None:
    """A1 finishes, the loop is killed while A2 trains: A1's inputs are beside its result and in the run record.
    A rerun with 6 SFT steps instead of 4 refuses A1 naming both values and launches nothing; a rerun with the
    same settings reuses A1 and trains A2 only."""
    out = tmp_path / "loop"
    killed = FaultInjectingRunnerKilledAt("a2")
    with pytest.raises(LoopKilledForTests):
        Loop(sft_config(out, FOUR, gpus), runner=killed).run()
    assert sorted(r.phase.name for r in killed.launched) == ["a1", "a2"]
    a1 = next(r for r in killed.launched if r.phase.name == "a1")
    assert json.loads((out / "a1" / PHASE_INPUTS).read_text()) == run_inputs(a1)
    assert json.loads((out / "a1" / PHASE_INPUTS).read_text())["overrides"][-1] == FOUR
    assert not (out / "a2" / PHASE_INPUTS).exists() and not (out / "a2" / "phase_result.json").exists()
    assert json.loads((out / RECORD).read_text())["phases"]["a1"]["status"] == "ok"

    changed = FaultInjectingRunnerKilledAt(None)
    with pytest.raises(StaleResultError) as err:
        Loop(sft_config(out, SIX, gpus), runner=changed).run()
    assert f"overrides: recorded ['{FOUR}'], now ['{SIX}']" in str(err.value)
    assert "phase a1: its recorded result was trained from other inputs" in str(err.value)
    assert f"move {out / 'a1'} aside" in str(err.value) and "\n" not in str(err.value)
    assert changed.launched == []

    same = FaultInjectingRunnerKilledAt(None)
    record = Loop(sft_config(out, FOUR, gpus), runner=same).run()
    assert [r.phase.name for r in same.launched] == ["a2"] and record["stopped_after"] == "sft"
    assert json.loads((out / "a2" / PHASE_INPUTS).read_text())["overrides"][-1] == FOUR


def test_a_result_without_recorded_inputs_is_refused_naming_its_folder(tmp_path: Path) -> None:
    """A1's result and export with no phase_inputs.json (the run stopped between the two writes): the loop cannot
    know what it was trained from, so it neither reuses nor overwrites it; it names the folder to move aside."""
    out = tmp_path / "loop"
    recorded(out / "a1", "a1", out / "a1" / "hf")
    runner = FaultInjectingRunnerKilledAt(None)
    with pytest.raises(StaleResultError, match=rf"phase a1: its result in {out / 'a1'} has no phase_inputs.json"):
        Loop(sft_config(out, FOUR, ()), runner=runner).run()
    assert runner.launched == [] and (out / "a1" / "phase_result.json").is_file()


def test_a_launch_forgets_the_inputs_of_an_earlier_one(tmp_path: Path) -> None:
    """A phase launched again (its last run failed) leaves no earlier inputs beside a result of this launch, and
    a failed phase records none."""
    out = tmp_path / "loop"
    cfg = sft_config(out, FOUR, ())
    recorded_as_run(cfg, "a1", "/base")
    failed = PhaseResult("a1", "cpu-smoke", "failed", 1, [], "/base", "d", str(out / "a1"), "t", 1.0)
    failed.write(out / "a1")  # the earlier inputs stay beside a failed result: the phase is not finished

    class FailingRunnerForTests:
        def __call__(self, run: PhaseRun) -> PhaseResult:
            return dataclasses.replace(failed, command=run.command())

    loop = Loop(dataclasses.replace(cfg, sft_overrides=(SIX,)), runner=FailingRunnerForTests())
    with pytest.raises(RuntimeError, match=r"phase a1 failed \(exit 1\)"):
        loop.run()
    assert not (out / "a1" / PHASE_INPUTS).exists()


def test_the_loop_command_prints_a_refusal_as_one_line(tmp_path: Path) -> None:
    """`trainer loop` with 6 SFT steps over an A1 trained with 4: one line naming both values, exit 1, no
    traceback (the refusal is no uncaught exception)."""
    from trainer.cli import app

    out = tmp_path / "loop"
    recorded_as_run(sft_config(out, FOUR, ()), "a1", "/base")
    args = ["loop", "--golden", str(SAMPLE), "--out", str(out), "--profile", "cpu-smoke", "--base-model", "/base",
            "--sft-override", SIX, "--reward-url", "http://127.0.0.1:9", "--until", "sft"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stopped: phase a1: its recorded result was trained from other")
    assert f"recorded ['{FOUR}'], now ['{SIX}']" in lines[0] and "Traceback" not in res.output
    assert not (out / "a2").exists()  # nothing launched

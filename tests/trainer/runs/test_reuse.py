"""trainer/runs/reuse.py: the one rule by which every recipe reuses a finished phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.registry.phases import get_phase
from trainer.runs import reuse


def _run(tmp_path: Path, *overrides: str, placed: tuple[str, ...] = (), model: str = "/base") -> PhaseRun:
    return PhaseRun(get_phase("b1"), "cpu-smoke", tmp_path / "data", tmp_path / "b1", model,
                    overrides=(*placed, *overrides), placed=placed)  # fmt: skip


def _finish(run: PhaseRun, export: bool = True) -> None:
    hf = run.out_dir / "hf"
    if export:
        hf.mkdir(parents=True)
    run.out_dir.mkdir(parents=True, exist_ok=True)
    PhaseResult("b1", "cpu-smoke", "ok", 0, [], run.model_path, "d", str(run.out_dir), "t", 1.0, hf_dir=str(hf)).write(
        run.out_dir
    )


def test_a_phase_is_finished_only_with_an_ok_result_and_its_export(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert reuse.finished(run.out_dir) is None
    _finish(run, export=False)
    assert reuse.finished(run.out_dir) is None  # the result says ok, the model is gone
    (run.out_dir / "hf").mkdir()
    assert reuse.finished(run.out_dir) is not None


def test_the_same_inputs_reuse_other_inputs_are_refused_by_name(tmp_path: Path) -> None:
    run = _run(tmp_path, "trainer.total_training_steps=3")
    _finish(run)
    reuse.record(run.out_dir, reuse.run_inputs(run))
    assert reuse.reuse_or_refuse(run.out_dir, reuse.run_inputs(run), "b1") is not None
    other = _run(tmp_path, "trainer.total_training_steps=4")
    verdict = reuse.check(other.out_dir, reuse.run_inputs(other))
    assert verdict.result is not None and not verdict.reusable
    assert verdict.difference == (
        "overrides: recorded ['trainer.total_training_steps=3'], now ['trainer.total_training_steps=4']"
    )
    with pytest.raises(reuse.StaleResultError, match=r"phase b1: its recorded result was trained from other inputs"):
        reuse.reuse_or_refuse(other.out_dir, reuse.run_inputs(other), "b1")
    # another start model is another input
    moved = _run(tmp_path, "trainer.total_training_steps=3", model="/other")
    assert "model_in: recorded 'name:/base', now 'name:/other'" in (
        reuse.check(moved.out_dir, reuse.run_inputs(moved)).difference or ""
    )


def test_the_placement_is_no_input(tmp_path: Path) -> None:
    one = _run(tmp_path, "x=1", placed=("trainer.n_gpus_per_node=1",))
    two = _run(tmp_path, "x=1", placed=("trainer.n_gpus_per_node=2", "y=2"))
    assert reuse.run_inputs(one) == reuse.run_inputs(two)
    _finish(one)
    reuse.record(one.out_dir, reuse.run_inputs(one))
    assert reuse.check(two.out_dir, reuse.run_inputs(two)).reusable


def test_a_result_without_recorded_inputs_is_never_reused(tmp_path: Path) -> None:
    """A finished result with no phase_inputs.json (a run stopped between the two writes, or a phase finished by
    something that records none): its inputs are unknown, so it is refused naming its folder, whatever is asked."""
    run = _run(tmp_path, "x=1")
    _finish(run)
    for asked in (run, _run(tmp_path, "z=9")):
        verdict = reuse.check(asked.out_dir, reuse.run_inputs(asked))
        assert verdict.result is not None and verdict.unrecorded and not verdict.reusable
        with pytest.raises(reuse.StaleResultError) as err:
            reuse.reuse_or_refuse(asked.out_dir, reuse.run_inputs(asked), "b1")
        assert str(err.value) == (
            f"phase b1: its result in {run.out_dir} has no phase_inputs.json (the run stopped before recording what it "
            f"was trained from), so its inputs are unknown; move {run.out_dir} aside to train it again from the "
            "current ones"
        )
    # an unreadable record is no record
    (run.out_dir / reuse.PHASE_INPUTS).write_text('{"model_in": ')
    assert reuse.check(run.out_dir, reuse.run_inputs(run)).unrecorded


def test_inputs_are_written_whole(tmp_path: Path) -> None:
    """The record is renamed into place: no temporary file is left, and what is read back is what was written."""
    run = _run(tmp_path, "x=1")
    _finish(run)
    inputs = reuse.run_inputs(run)
    reuse.record(run.out_dir, inputs)
    assert sorted(p.name for p in run.out_dir.iterdir()) == ["hf", "phase_inputs.json", "phase_result.json"]
    assert reuse.check(run.out_dir, inputs).reusable
    reuse.forget(run.out_dir)
    assert not (run.out_dir / reuse.PHASE_INPUTS).exists()


def test_the_model_behind_the_reward_is_an_input(tmp_path: Path) -> None:
    """C1 learns from the frozen π2 its pipeline reward runs: trained against one π2, it is not reused with
    another (the reward API's URL is no input); a phase without such a reward records none."""
    pi2, other = tmp_path / "pi2", tmp_path / "pi2_other"
    for folder, weights in ((pi2, b"a"), (other, b"b")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)

    def c1(reward_model: Path, url: str) -> PhaseRun:
        return PhaseRun(get_phase("c1"), "cpu-smoke", tmp_path / "data", tmp_path / "c1", "/pi1", reward_url=url,
                        reward_model=str(reward_model))  # fmt: skip

    run = c1(pi2, "http://127.0.0.1:1")
    run.out_dir.mkdir(parents=True)
    (run.out_dir / "hf").mkdir()
    PhaseResult("c1", "cpu-smoke", "ok", 0, [], "/pi1", "d", str(run.out_dir), "t", 1.0,
                hf_dir=str(run.out_dir / "hf")).write(run.out_dir)  # fmt: skip
    reuse.record(run.out_dir, reuse.run_inputs(run))
    assert reuse.check(run.out_dir, reuse.run_inputs(c1(pi2, "http://127.0.0.1:2"))).reusable
    stale = reuse.check(run.out_dir, reuse.run_inputs(c1(other, "http://127.0.0.1:1")))
    assert not stale.reusable and (stale.difference or "").startswith("reward_model: recorded ")
    assert "reward_model" not in reuse.run_inputs(_run(tmp_path))

"""The loop's golden preflight (trainer/runs/loop.py, ``Loop.check_splits``): before any phase, an empty split or
(``--strict-splits``) splits that share a document stop the loop in one line; otherwise the train rows that repeat
a held-out document are left out of every phase's data and recorded, and data built without leaving them out is
not reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.golden import EmptySplitError
from shared.split_overlap import SplitOverlapError
from tests.shared.test_split_overlap import DROPPED, overlapping_golden
from tests.trainer.runs.test_loop import FaultyPhaseRunner
from trainer.data.datasets import read_rows
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop
from trainer.runs.record import RECORD


def config(golden: Path, out: Path, strict: bool = False) -> LoopConfig:
    return LoopConfig(golden=golden, out=out, profile="cpu-smoke", pi1_sft="/pi1s", pi2_sft="/pi2s",
                      reward_url="http://127.0.0.1:9", strict_splits=strict)  # fmt: skip


def test_strict_splits_stops_the_loop_before_any_phase(tmp_path: Path) -> None:
    runner = FaultyPhaseRunner()
    with pytest.raises(SplitOverlapError, match="splits share documents") as err:
        Loop(config(overlapping_golden(tmp_path / "golden"), tmp_path / "loop", strict=True), runner=runner).run()
    assert "\n" not in str(err.value) and all(i in str(err.value) for i in DROPPED)
    assert runner.launched == [] and not (tmp_path / "loop" / "data").exists()


def test_an_empty_split_stops_the_loop_before_any_phase(tmp_path: Path) -> None:
    runner = FaultyPhaseRunner()
    with pytest.raises(EmptySplitError, match=r"common_test_schemas\.jsonl: the test split is empty"):
        Loop(config(overlapping_golden(tmp_path / "golden", empty="test"), tmp_path / "loop"), runner=runner).run()
    assert runner.launched == [] and not (tmp_path / "loop" / "data").exists()


def test_the_loop_command_says_it_in_one_line(tmp_path: Path) -> None:
    from trainer.cli import app

    golden = overlapping_golden(tmp_path / "golden")
    args = ["loop", "--golden", str(golden), "--out", str(tmp_path / "loop"), "--profile", "cpu-smoke",
            "--pi1-sft", "/pi1s", "--pi2-sft", "/pi2s", "--reward-url", "http://127.0.0.1:9"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--strict-splits"])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --golden: splits share documents"), res.output
    assert not (tmp_path / "loop" / "data").exists()


def test_by_default_the_repeats_are_left_out_recorded_and_stale_data_is_not_reused(tmp_path: Path) -> None:
    golden, out = overlapping_golden(tmp_path / "golden"), tmp_path / "loop"
    runner = FaultyPhaseRunner()
    with pytest.raises(RuntimeError, match="phase b1 failed"):
        Loop(config(golden, out), runner=runner).run()
    assert [r.phase.name for r in runner.launched] == ["b1", "b2"]  # launched in turn, each failed
    record = json.loads((out / RECORD).read_text())
    assert record["split_overlap"]["dropped_train"] == {"count": 3, "ids": DROPPED}
    assert record["split_overlap"]["documents_shared"] == {"train~validation": 1, "train~test": 2,
                                                          "validation~test": 0}  # fmt: skip
    assert record["data"]["counts"]["b1"] == {"train": 11, "validation": 6}
    for phase in ("b1", "b2", "c1"):
        trained = {r["extra_info"]["id"] for r in read_rows(out / "data" / phase / "train.parquet")}
        assert not trained & set(DROPPED) and len(trained) == 11
    manifest = out / "data" / "manifest.json"
    assert json.loads(manifest.read_text())["split_overlap"]["dropped_train"]["ids"] == DROPPED

    # data built before the check (no record of what was dropped) holds the repeats: not reused
    built = json.loads(manifest.read_text())
    built.pop("split_overlap")
    manifest.write_text(json.dumps(built))
    runner2 = FaultyPhaseRunner()
    stale = r"loop/data holds data built with train rows that repeat .*: remove it"
    with pytest.raises(SplitOverlapError, match=stale):
        Loop(config(golden, out), runner=runner2).run()
    assert runner2.launched == []

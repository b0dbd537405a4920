"""The batch-splitting benchmark (bench/nested_batches.py) on a small step batch: both paths timed and profiled in
one process, the offsets path reading back far fewer values and unbinding nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import nested_batches

pytestmark = pytest.mark.verl


def test_both_paths_are_timed_and_the_offsets_path_reads_back_fewer_values(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path)
    p = nested_batches.run("cpu", samples=32, mini=8, fields=4, repeats=2)
    verl, ours = p["rows"]["verl"], p["rows"]["offsets"]
    assert len(verl["times_s"]) == len(ours["times_s"]) == 2 and p["tokens"] >= 32 * 200
    # VERL: one read a sample per nested field in each selection (4 mini + 8 micro selections of 8 and 4)
    assert verl["item_calls"] >= 4 * (4 * 8 + 8 * 4) and verl["unbind_calls"] >= 4 * 12
    # by offsets: a fixed handful a field and selection (bounds, total, shortest and longest), none a sample
    assert ours["unbind_calls"] == 0 and ours["item_calls"] <= 6 * 4 * 12 < verl["item_calls"]
    saved = json.loads((tmp_path / "nested_batches.json").read_text())
    assert saved["rows"]["offsets"]["item_calls"] == ours["item_calls"] and saved["run"]["command"]
    assert "| offsets |" in (tmp_path / "nested_batches.md").read_text()


def test_a_batch_that_mini_batches_do_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of --mini"):
        nested_batches.run("cpu", samples=30, mini=8)

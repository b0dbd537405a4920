"""The response-slicing benchmark (bench/response_padding.py) on a small micro batch: both paths timed and
profiled in one process, the gather reading back far fewer values than VERL's per-sample loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import response_padding

pytestmark = pytest.mark.verl


def test_both_paths_are_timed_and_the_gather_reads_back_fewer_values(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path)
    p = response_padding.run("cpu", samples=16, repeats=2)
    loop, gather = p["rows"]["verl_loop"], p["rows"]["one_gather"]
    assert len(loop["times_s"]) == len(gather["times_s"]) == 2 and p["tokens"] > 16 * (180 + 15)
    # VERL's loop: two bound reads a sample for each of the two outputs at least; the gather: a fixed handful
    assert loop["item_calls"] >= 2 * 2 * 16 and gather["item_calls"] <= 8
    assert loop["pad_calls"] == 2 * 16 and gather["pad_calls"] == 0
    saved = json.loads((tmp_path / "response_padding.json").read_text())
    assert saved["rows"]["one_gather"]["item_calls"] == gather["item_calls"] and saved["run"]["command"]
    assert "| one_gather |" in (tmp_path / "response_padding.md").read_text()

"""π1's Stage-1 schemas kept for a rerun: used again only under the same key, cut answers still cut."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.evaluation.generation import Completion, truncated
from trainer.evaluation.stage1_cache import cached_stage1


def test_schemas_are_kept_under_their_key_and_run_again_under_another(tmp_path: Path) -> None:
    path, runs = tmp_path / "cache" / "a1.json", []

    def run() -> list[str]:
        runs.append(1)
        return [Completion('{"columns": []}', "stop"), Completion('{"colu', "length")]

    key = {"model": "sha-1", "golden": "sha-g", "generation": {"max_tokens": 8}}
    first, kept = cached_stage1(path, key, run)
    assert not kept and len(runs) == 1 and json.loads(path.read_text())["key"] == key
    again, kept = cached_stage1(path, dict(key), run)
    assert kept and len(runs) == 1 and again == first
    assert [truncated(s) for s in again] == [False, True]  # the finish reason came back with the text
    _, kept = cached_stage1(path, {**key, "model": "sha-2"}, run)  # another π1: run again, file replaced
    assert not kept and len(runs) == 2 and json.loads(path.read_text())["key"]["model"] == "sha-2"

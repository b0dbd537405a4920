"""An evaluation's answers kept as they come: reused only under an equal key and for the same prompt, a torn last
line dropped, the differences of another key named; output folders checked before a run; final files whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.evaluation.answer_log import AnswerLog, OutputNotWritable, check_writable, need_bytes, write_atomic
from trainer.evaluation.generation import Completion, refusal, truncated

KEY = {"setting": "x", "generation": {"concurrency": 16, "max_tokens": 64}}


def test_answers_are_reused_under_the_same_key_for_the_same_prompt(tmp_path: Path) -> None:
    path = tmp_path / "x.partial.jsonl"
    log = AnswerLog.open(path, KEY)
    assert len(log) == 0 and log.changed == []
    log.add("stage1", "d1", "h1", Completion('{"columns": []}', "stop"))
    log.add("stage1", "d2", "h2", Completion("{", "length"))
    log.add("stage2", "d1", "h3", Completion("", refused="HTTP 400: too long"))
    assert len(path.read_text().splitlines()) == 3  # on disk as they come
    again = AnswerLog.open(path, json.loads(json.dumps(KEY)))
    assert len(again) == 3 and again.changed == []
    assert again.get("stage1", "d1", "h1") == '{"columns": []}' and again.get("stage1", "d1", "other") is None
    assert truncated(again.get("stage1", "d2", "h2"))
    assert refusal(again.get("stage2", "d1", "h3")) == "HTTP 400: too long"


def test_another_key_starts_over_naming_each_difference(tmp_path: Path) -> None:
    path = tmp_path / "x.partial.jsonl"
    AnswerLog.open(path, KEY).add("stage1", "d1", "h1", Completion("a", "stop"))
    other = {"setting": "x", "generation": {"concurrency": 2, "max_tokens": 64}, "serving": "gpu"}
    log = AnswerLog.open(path, other)
    assert len(log) == 0 and path.read_text() == ""
    assert log.changed == ["generation.concurrency: 16 → 2", 'serving: "(none)" → "gpu"']
    assert json.loads(log.key_path.read_text()) == other


def test_a_line_torn_by_a_crash_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "x.partial.jsonl"
    AnswerLog.open(path, KEY).add("stage1", "d1", "h1", Completion("a", "stop"))
    with path.open("a") as fh:
        fh.write('{"stage": "stage1", "id": "d2", "sha2')  # the process died mid-write
    log = AnswerLog.open(path, KEY)
    assert len(log) == 1 and path.read_text().endswith("\n")
    log.add("stage1", "d2", "h2", Completion("b", "stop"))
    assert len(AnswerLog.open(path, KEY)) == 2  # the new line is whole, not glued to the torn one


def test_an_answer_that_cannot_be_kept_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.partial.jsonl"
    log = AnswerLog.open(path, KEY)
    path.unlink()
    path.mkdir()  # a folder in the way: appending fails
    with pytest.raises(OutputNotWritable, match=rf"^{path}: cannot keep an answer \(Is a directory\)"):
        log.add("stage1", "d1", "h1", Completion("a", "stop"))


def test_an_unwritable_or_full_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_writable(tmp_path / "new" / "out", need_bytes(10, 2, 64))
    assert (tmp_path / "new" / "out").is_dir() and list((tmp_path / "new" / "out").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputNotWritable, match=r"file/out: cannot write there \(Not a directory\)$"):
        check_writable(tmp_path / "file" / "out")

    class FaultInjectingFullDisk:  # what shutil.disk_usage says of a full disk
        free = 1 << 20

    monkeypatch.setattr("trainer.evaluation.answer_log.shutil.disk_usage", lambda _p: FaultInjectingFullDisk)
    with pytest.raises(OutputNotWritable, match=r"1.0 MiB free on its disk, the evaluation writes up to 8.3 MiB$"):
        check_writable(tmp_path, need_bytes(10, 2, 384))


def test_a_final_file_is_whole_or_keeps_what_it_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "predictions.jsonl"
    write_atomic(path, "old\n")

    def fail(*_a: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("trainer.evaluation.answer_log.os.replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["predictions.jsonl"]

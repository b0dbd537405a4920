"""An evaluation's answers written as they come, so that a run cut short (a dead executor, a full disk, an
allocation that ended) keeps them and a rerun continues from them; and its output folder checked before it starts.

An :class:`AnswerLog` is a JSONL file, one line per answered prompt (its stage, the document's id, the prompt's
sha256, the text and finish reason, or why the executor refused it), appended and flushed as each answer arrives.
The key of what produced the answers (the setting, the models, the generation settings, how they were served) is
written beside it (``<log>.key.json``). Opened again under an equal key its answers are used again, each only for
the same prompt; under another key it starts over, and :attr:`AnswerLog.changed` names each difference with both
values. A line torn by a crash is dropped when the log is opened.

Final files are written whole or not at all (:func:`write_atomic`: a temporary file beside, then ``os.replace``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.evaluation.generation import Completion, refusal

KEY_SUFFIX = ".key.json"
# what a setting's answers take on disk, per document, besides their text: hashes, ids, flags (a generous bound)
RECORD_OVERHEAD_BYTES = 2048
BYTES_PER_TOKEN = 8  # a generous bound: UTF-8 and JSON escaping of a token's characters
MARGIN_BYTES = 8 << 20  # metrics.json, report.md and the plots


class OutputNotWritable(RuntimeError):
    """An output folder that cannot be written (missing rights, a read-only or full disk, a file in the way)."""


def need_bytes(documents: int, settings: int, max_tokens: int) -> int:
    """What an evaluation writes at most: each setting's two answers per document, in its answer log and its
    predictions file, and the report."""
    per_document = 2 * max_tokens * BYTES_PER_TOKEN + RECORD_OVERHEAD_BYTES
    return 2 * documents * settings * per_document + MARGIN_BYTES


def check_writable(folder: Path, need: int = 0) -> None:
    """Raise :class:`OutputNotWritable` (one line: the folder and the reason) unless ``folder`` can be created, a
    file can be written in it, and its disk has ``need`` bytes free."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-") as probe:
            probe.write(b"x")
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        raise OutputNotWritable(f"{folder}: cannot write there ({exc.strerror or exc})") from exc
    if free < need:
        raise OutputNotWritable(
            f"{folder}: {free / 2**20:.1f} MiB free on its disk, the evaluation writes up to {need / 2**20:.1f} MiB"
        )


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or keeps what it held: written beside it, flushed, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def key_changes(old: Any, new: Any) -> list[str]:
    """Each difference between two keys, as ``field: old → new`` (``(none)`` where a side lacks it)."""
    a, b = _flat(old if isinstance(old, Mapping) else {"key": old}), _flat(new)
    return [
        f"{k}: {json.dumps(a.get(k, '(none)'))} → {json.dumps(b.get(k, '(none)'))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, "(none)") != b.get(k, "(none)")
    ]


class AnswerLog:
    """The answers of one setting of an evaluation (both stages), kept on disk under ``key`` as they come.

    Use :meth:`open`; :meth:`get` an answer of an earlier run, :meth:`add` one as it arrives (thread-safe)."""

    def __init__(self, path: Path, key: Mapping[str, Any]) -> None:
        self.path = path
        self.key_path = path.with_name(path.name + KEY_SUFFIX)
        self.key = json.loads(json.dumps(key, default=str))
        self.changed: list[str] = []  # why the answers of an earlier run were not used (empty: there were none)
        self._answers: dict[tuple[str, str, str], Completion] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, key: Mapping[str, Any]) -> AnswerLog:
        """The log at ``path``: its answers under an equal key, else empty (the file started over)."""
        log = cls(path, key)
        try:
            kept = json.loads(log.key_path.read_text()) if log.key_path.is_file() else None
        except ValueError:
            kept = "(unreadable)"
        if kept == log.key and path.is_file():
            log._read()
            return log
        if kept is not None:
            log.changed = key_changes(kept, log.key) or ["the key could not be read"]
        # the answers go first, then the key: a crash between leaves no answer under a key that did not write it
        write_atomic(path, "")
        write_atomic(log.key_path, json.dumps(log.key, indent=2) + "\n")
        return log

    def _read(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        good: list[str] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                answer = Completion(rec["text"], rec.get("finish_reason"), rec.get("refused"))
                self._answers[(rec["stage"], rec["id"], rec["sha256"])] = answer
                good.append(line)
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash (the last one, cut mid-write)
        if len(good) != len([ln for ln in lines if ln.strip()]) or (text and not text.endswith("\n")):
            write_atomic(self.path, "".join(f"{ln}\n" for ln in good))

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)

    def get(self, stage: str, doc_id: str, sha256: str) -> Completion | None:
        """The answer kept for this prompt (stage, document, the prompt's hash), or None."""
        with self._lock:
            return self._answers.get((stage, doc_id, sha256))

    def add(self, stage: str, doc_id: str, sha256: str, answer: str) -> None:
        """Keep ``answer`` (appended and flushed); :class:`OutputNotWritable` names the file when that fails."""
        kept = Completion(str(answer), getattr(answer, "finish_reason", None), refusal(answer))
        rec = {"stage": stage, "id": doc_id, "sha256": sha256, "text": str(kept), "finish_reason": kept.finish_reason,
               "refused": kept.refused}  # fmt: skip
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self._lock:
            try:
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(line)
                    fh.flush()
            except OSError as exc:
                raise OutputNotWritable(f"{self.path}: cannot keep an answer ({exc.strerror or exc})") from exc
            self._answers[(stage, doc_id, sha256)] = kept

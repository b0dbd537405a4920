"""A run's manifest: one JSON file, rewritten whole (through a temporary file) after every step, safe to set from
the threads of phases that run side by side; and the JSON reader the content keys use."""

from __future__ import annotations

import datetime as dt
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is none (a key never written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Manifest:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    # Phases beside each other (A1 and A2, B1 and B2, Phase-D settings) record from their own threads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path) -> Manifest:
        return cls(path, json.loads(path.read_text()) if path.is_file() else {})

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.data["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
            tmp.replace(self.path)

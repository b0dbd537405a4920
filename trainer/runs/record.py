"""A run's record, written by every recipe: ``run.json`` (rewritten whole after every step, safe from threads:
``recipe``, ``config``, ``parts`` with each part's status and seconds, ``phases`` with each phase's result,
``phase_d`` with each Phase D's folder, settings and headline metrics, and the recipe's own keys) and ``report.md``
made from it. ``bench/learning_gpu.py`` and ``bench/demo.py`` read these keys."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD = "run.json"
REPORT = "report.md"
HEADLINE = ("schema_valid", "table_valid", "aligned_cell_f1")


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is none (a key never written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def as_json(value: Any) -> Any:
    """A dataclass (a config, a result) as JSON values: paths as strings, tuples as lists."""
    plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    return json.loads(json.dumps(plain, default=str))


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class RunRecord:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def open(cls, root: Path, recipe: str, config: Any) -> RunRecord:
        path = root / RECORD
        record = cls(path, json.loads(path.read_text()) if path.is_file() else {})
        record.data |= {"recipe": recipe, "config": as_json(config)}  # written with the first entry (not by a dry run)
        return record

    def set(self, key: str, value: Any, section: str | None = None) -> None:
        """``data[key] = value`` (``data[section][key]`` with a section), then the file rewritten."""
        with self.lock:
            (self.data.setdefault(section, {}) if section else self.data)[key] = value
            self.data["updated"] = now()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
            tmp.replace(self.path)

    def get(self, section: str, key: str) -> Any:
        return self.data.get(section, {}).get(key)

    def phase_d(self, tag: str, folder: Path, settings: dict[str, Any], decision: Any = None) -> None:
        """A Phase D's entry: its folder, settings, each setting's headline metrics (from its ``metrics.json``)."""
        metrics = read_json(folder / "metrics.json") or {}
        headline = {name: {k: s.get("overall", {}).get(k) for k in (*HEADLINE, "n")}
                    for name, s in metrics.get("settings", {}).items()}  # fmt: skip
        entry = {"dir": str(folder), "settings": settings, "headline": headline, "decision": decision}
        self.set(tag, entry, "phase_d")

    def write_report(self) -> Path:
        """``report.md`` beside ``run.json``."""
        out = self.path.parent / REPORT
        out.write_text(render(self.data, self.path.parent))
        return out


def render(data: dict[str, Any], root: Path) -> str:
    cfg = data.get("config", {})
    lines = [f"# {data.get('recipe', 'run')}: {root}", "",
             f"golden `{cfg.get('golden')}`, profile {cfg.get('profile')}, GPUs {cfg.get('gpus') or 'none'}; "
             f"record `{RECORD}` (updated {data.get('updated')})", ""]  # fmt: skip
    lines += parts_and_phases(data)
    lines += choice_lines(data.get("sft_choice"))
    for tag, pd in data.get("phase_d", {}).items():
        folder = Path(pd["dir"])
        rel = folder.relative_to(root) if folder.is_relative_to(root) else folder
        lines += [f"## Phase D: {tag} ([report]({rel}/{REPORT}))", "",
                  "| setting | n | " + " | ".join(HEADLINE) + " |", "|---|---|" + "---|" * len(HEADLINE)]  # fmt: skip
        for name, h in pd.get("headline", {}).items():
            lines.append(f"| {name} | {h.get('n')} | " + " | ".join(fmt(h.get(k)) for k in HEADLINE) + " |")
        if (pd.get("decision") or {}).get("decision") in ("continue", "stop"):
            lines.append(f"\ndecision: {pd['decision'].get('decision')} ({pd['decision'].get('reason', '')})")
        lines.append("")
    return "\n".join(lines)


def parts_and_phases(data: dict[str, Any]) -> list[str]:
    """The report's tables of the parts' times and the phases' results."""
    lines: list[str] = []
    parts = data.get("parts", {})
    if parts:
        lines += ["## Parts", "", "| part | status | seconds |", "|---|---|---|"]
        lines += [f"| {n} | {p.get('status', '')} | {p.get('seconds', '')} |" for n, p in parts.items()]
        lines.append("")
    phases = data.get("phases", {})
    if phases:
        lines += ["## Phases", "", "| phase | status | seconds | model |", "|---|---|---|---|"]
        lines += [f"| {n} | {p.get('status')} | {p.get('seconds')} | `{p.get('hf_dir')}` |" for n, p in phases.items()]
        lines.append("")
    return lines


def choice_lines(choice: dict[str, Any] | None) -> list[str]:
    """``trainer experiment sft-choice``'s verdict: each candidate's means (95% intervals) and the choice."""
    if not choice:
        return []
    cands = choice["candidates"]
    held = sorted({h for c in cands.values() for h in c["held_out"]["per_source"]})

    def cell(value: Any, ci: Any) -> str:
        return fmt(value) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    lines = [f"## The choice: {choice['chosen']}", "", f"{choice['rule']}; metric {choice['metric']}, end to end on "
             "the validation split (held out: trained without the source, scored on it).", "",
             "| candidate | validation macro | " + " | ".join(f"without {h}: on {h}" for h in held)
             + " | held-out macro | beaten on a held-out source |", "|---|---|" + "---|" * (len(held) + 2)]  # fmt: skip
    for name, c in cands.items():
        v, h = c["validation"], c["held_out"]
        cells = [cell(h["per_source"].get(s), h["per_source_ci95"].get(s)) for s in held]
        beaten = "; ".join(choice["beaten_on_held_out"].get(name, [])) or "no"
        lines.append(f"| {name} | {cell(v['macro'], v['macro_ci95'])} | " + " | ".join(cells)
                     + f" | {fmt(h['macro'])} | {beaten} |")  # fmt: skip
    lines.append("")
    return lines


def fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "" if value is None else str(value)

"""Reliability suite: real reward_api processes under load, executor faults, bad input, auth and limits.

Scale: the CI version runs by default; ``RELIABILITY_FULL=1`` (set by ``python -m bench reliability``)
runs the full sizes (e.g. 32 clients × 200 requests instead of 8 × 25) and more fuzzing examples.
Every test records what it tried, what it expected and what it observed (``record_property``); at the
end of a ``python -m bench reliability`` run the outcomes are written to
``bench/results/reliability[.quick].{json,md}`` (a plain pytest run writes nothing) and, with
``RELIABILITY_RECORD=1``, into the table of ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from shared import GoldenExample, read_split
from tests.helpers.servers import RewardApiServer

FULL = os.environ.get("RELIABILITY_FULL", "") not in ("", "0")
# `python -m bench reliability [--quick]` sets RELIABILITY_FULL and records the results; a plain pytest run
# (`make test`) checks the same things and writes no tracked file, so it leaves `git status` clean.
RECORD_RESULTS = "RELIABILITY_FULL" in os.environ
RECORD_DOCS = os.environ.get("RELIABILITY_RECORD", "") not in ("", "0")
REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
START, END = "<!-- reliability-table:start -->", "<!-- reliability-table:end -->"


@dataclass(frozen=True)
class Scale:
    """Sizes of the suite: the full run, or the CI run (which says so in the results)."""

    full: bool
    load_clients: int
    load_requests: int
    load_batch: int
    fuzz_examples: int


SCALE = Scale(True, 32, 200, 16, 150) if FULL else Scale(False, 16, 50, 16, 12)


@pytest.fixture(scope="session")
def scale() -> Scale:
    return SCALE


@pytest.fixture(scope="session")
def examples(golden_dir: Path) -> list[GoldenExample]:
    """Real golden examples with distinct documents (first 200 of the test split)."""
    seen: set[str] = set()
    out = []
    for ex in read_split(golden_dir, "test", limit=600):
        if ex.text not in seen:
            seen.add(ex.text)
            out.append(ex)
    return out[:200]


@pytest.fixture(scope="module")
def local_api() -> Iterator[RewardApiServer]:
    """A reward_api with 2 workers and no executor (schema / table endpoints)."""
    with RewardApiServer({"REWARD_API_LOG_LEVEL": "WARNING"}, workers=2) as api:
        yield api


# ---- what every answer must satisfy -----------------------------------------------------------------

# Every code point, lone UTF-16 surrogates included. hypothesis leaves surrogates out of ``st.text`` even
# when the alphabet holds them, so strings are joined from lists of characters.
FULL_UNICODE = st.characters(codec=None, exclude_categories=()) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF
)


def full_text(max_size: int) -> st.SearchStrategy[str]:
    """Strings of any code points, lone surrogates included."""
    return st.lists(FULL_UNICODE, max_size=max_size).map("".join)


def _bounds(cfg: Any) -> tuple[float, float]:
    cfg = cfg if isinstance(cfg, dict) else {}
    return float(cfg.get("min_reward", -1.0)), float(cfg.get("max_reward", 1.0))


def reward_problems(endpoint: str, config: Any, body: Any) -> list[str]:
    """The invariant of every 200: each reward is a finite number within its config's [min_reward,
    max_reward] (pipeline: the combined reward, and each part within its part's bounds)."""
    cfg = config if isinstance(config, dict) else {}
    checks = [("reward", _bounds(cfg))]
    if endpoint == "pipeline":
        checks += [
            ("schema_reward", _bounds(cfg.get("schema_reward"))),
            ("table_reward", _bounds(cfg.get("table_reward"))),
        ]
    out = []
    results = body.get("results", []) if isinstance(body, dict) else []
    for res in results:
        for key, (lo, hi) in checks:
            v = res.get(key)
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
                out.append(f"{res.get('id')!r}: {key}={v!r} outside [{lo}, {hi}] or not finite")
    return out


# ---- outcome recording -------------------------------------------------------------------------

_OUTCOMES: list[dict[str, Any]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        fn = getattr(item, "function", None)
        doc = (fn.__doc__ or "").strip() if fn is not None else ""
        module = getattr(item, "module", None)
        area = (module.__doc__ or "").strip().split(":", 1)[0] if module is not None else ""
        props = dict(item.user_properties)
        _OUTCOMES.append(
            {
                "test": item.nodeid.split("tests/reliability/", 1)[-1],
                "area": area,
                "tried": str(props.get("tried") or (doc.splitlines()[0] if doc else item.name)),
                "expected": props.get("expected", ""),
                "observed": props.get("observed", "") if report.passed else _short(report.longreprtext),
                "held": "held" if report.passed else ("skipped" if report.skipped else "FAILED"),
            }
        )


def _short(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
    return (" ".join(ln[2:].strip() for ln in lines[:3]) or text[-200:]).replace("|", "/")[:300]


def _merged(timestamp: str) -> list[dict[str, Any]]:
    """This run's outcomes over the last recorded ones of the same scale: a run of a subset (say, only
    the kill -9 test) updates its rows and keeps the others, each row with the time it was observed."""
    from bench.common import RESULTS_DIR

    for o in _OUTCOMES:
        o.setdefault("observed_at", timestamp)
    path = RESULTS_DIR / ("reliability.json" if SCALE.full else "reliability.quick.json")
    try:
        previous = json.loads(path.read_text())["outcomes"]
    except (OSError, ValueError, KeyError):
        previous = []
    fresh = {o["test"] for o in _OUTCOMES}
    kept = [o for o in previous if o.get("test") not in fresh]
    return sorted(kept + _OUTCOMES, key=lambda o: str(o["test"]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _OUTCOMES or not RECORD_RESULTS:
        return
    from bench.common import header_md, md_table, run_record, write_result

    record = run_record(quick=not SCALE.full)
    outcomes = _merged(record["timestamp"])
    payload = {
        "suite": "reliability",
        "run": record,
        "scale": SCALE.__dict__,
        "held": sum(o["held"] == "held" for o in outcomes),
        "failed": sum(o["held"] == "FAILED" for o in outcomes),
        "skipped": sum(o["held"] == "skipped" for o in outcomes),
        "outcomes": outcomes,
    }
    table = md_table(
        ["area", "what was tried", "expected", "observed", "held?"],
        [[o["area"], o["tried"], o["expected"], o["observed"], o["held"]] for o in outcomes],
    )
    scale_line = (
        f"Scale: {'full' if SCALE.full else 'CI (scaled down)'}: load {SCALE.load_clients} clients × "
        f"{SCALE.load_requests} requests × {SCALE.load_batch} items; {SCALE.fuzz_examples} fuzz examples per "
        f"operation. {payload['held']} held, {payload['failed']} failed, {payload['skipped']} skipped. "
        f"Rows observed at: {', '.join(sorted({str(o.get('observed_at', '?')) for o in outcomes}))} (UTC; a subset run "
        "updates only its rows).\n\n"
    )
    md = header_md("Reliability suite", record) + scale_line + table
    write_result("reliability", payload, md, quick=not SCALE.full)
    if RECORD_DOCS and DOC.is_file():
        text = DOC.read_text()
        if START in text and END in text:
            head, rest = text.split(START, 1)
            _, tail = rest.split(END, 1)
            block = f"{START}\n_Generated by `{record['command']}` at {record['timestamp']}; {scale_line.strip()}_\n\n"
            DOC.write_text(head + block + table + END + tail)

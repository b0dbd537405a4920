"""Table parsing and the original positional cell accuracy (docs/rewards.md).

The cell comparison form (``normalize_cell``) is shared by every table metric: ``str(v).strip()``,
with ``None`` (and a missing key) as ``""``, JSON booleans as ``true``/``false`` and JSON numbers as
the literal the model wrote (``1.50`` stays ``"1.50"``, so it matches the text ``"1.50"``; Python's
``str(1.5)`` would not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedTable:
    """Result of :func:`parse_ndjson_detailed`: the rows, or the first line that broke the table."""

    rows: list[Row] = field(default_factory=list)
    valid: bool = True
    error: str | None = None


class JsonFloat(float):
    """A JSON number with a fraction or exponent that remembers how it was written: ``str`` gives the
    literal (``1.50``), arithmetic and equality behave as the float. ``parse_ndjson`` makes these."""

    __slots__ = ("literal",)
    literal: str

    def __new__(cls, literal: str) -> JsonFloat:
        obj = super().__new__(cls, literal)
        obj.literal = literal
        return obj

    def __str__(self) -> str:
        return self.literal


def normalize_cell(value: Any) -> str:
    """The comparison form of a cell: ``None`` → ``""``, ``True``/``False`` → ``"true"``/``"false"``
    (as JSON writes them), anything else ``str(v).strip()`` (a parsed JSON number gives its literal)."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value).strip()


def parse_ndjson_detailed(text: str) -> ParsedTable:
    """Parse NDJSON; every non-empty line must be a JSON object, otherwise the table is invalid.

    Numbers with a fraction or exponent come back as :class:`JsonFloat` (their literal is kept for the
    cell comparison). Lines end at ``\n`` only (``\r\n`` tolerated): ``str.splitlines`` would also split on U+0085 or
    U+2028, which JSON allows raw inside a string.
    """
    rows: list[Row] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_float=JsonFloat)
        except (ValueError, RecursionError) as exc:
            return ParsedTable([], False, f"line {lineno}: invalid JSON ({type(exc).__name__})")
        if not isinstance(obj, dict):
            return ParsedTable([], False, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
        rows.append(obj)
    return ParsedTable(rows, True)


def parse_ndjson(text: str) -> list[Row] | None:
    """Rows of an NDJSON text, or ``None`` when any non-empty line is not a JSON object."""
    parsed = parse_ndjson_detailed(text)
    return parsed.rows if parsed.valid else None


def table_column_names(table: Mapping[str, Any]) -> list[str]:
    """Column names of a golden table; columns may be ``{"name": ...}`` objects or strings."""
    return [c if isinstance(c, str) else str(c["name"]) for c in table["columns"]]


def gold_table_to_rows(gold_table: Mapping[str, Any]) -> list[Row]:
    """``{"columns", "data"}`` → one dict per row, keys in column order."""
    names = table_column_names(gold_table)
    return [dict(zip(names, row, strict=True)) for row in gold_table.get("data", [])]


def cell_accuracy(pred_rows: Sequence[Mapping[str, Any]], gold_rows: Sequence[Mapping[str, Any]]) -> float:
    """Positional cell accuracy, the original table metric (``table_metric: positional``).

    Rows are paired by position over n = max(#pred, #gold) (a missing row is ``{}``). Each pair
    contributes one cell per key in the union of both rows' keys; a cell is correct when
    ``normalize_cell`` agrees. accuracy = correct / cells; no rows at all on both sides → 1.0;
    rows present but no keys anywhere → 1.0 (nothing was asked, nothing was wrong).
    """
    n = max(len(pred_rows), len(gold_rows))
    if n == 0:
        return 1.0
    correct = total = 0
    for i in range(n):
        pred = pred_rows[i] if i < len(pred_rows) else {}
        gold = gold_rows[i] if i < len(gold_rows) else {}
        for key in pred.keys() | gold.keys():
            total += 1
            correct += normalize_cell(pred.get(key)) == normalize_cell(gold.get(key))
    return correct / total if total else 1.0

"""Golden data IO (docs/golden_data.md): read, write and validate ``common_{split}_schemas.jsonl``.

A bad line is an error that names the file, the line and the field; nothing is skipped silently.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SPLITS = ("train", "validation", "test")


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (datasets and models record where they came from)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def golden_filename(split: str) -> str:
    """``common_{split}_schemas.jsonl``."""
    return f"common_{split}_schemas.jsonl"


class Column(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)


class GoldSchema(BaseModel):
    """``{"table_id", "columns": [{"name"}, ...]}``; ``table_id`` is optional on the wire."""

    model_config = ConfigDict(extra="allow")

    table_id: str | None = None
    columns: list[Column]

    @model_validator(mode="after")
    def _unique_names(self) -> GoldSchema:
        names = [c.name for c in self.columns]
        dup = [n for n, k in Counter(names).items() if k > 1]
        if dup:
            raise ValueError(f"duplicate column names: {dup}")
        return self

    def names(self) -> list[str]:
        return [c.name for c in self.columns]


class GoldTable(GoldSchema):
    """A gold table: columns plus rows of string-or-null cells, each row as long as ``columns``."""

    data: list[list[str | None]]

    @model_validator(mode="after")
    def _row_lengths(self) -> GoldTable:
        for i, row in enumerate(self.data):
            if len(row) != len(self.columns):
                raise ValueError(f"data[{i}] has {len(row)} cells but there are {len(self.columns)} columns")
        return self


class GoldenExample(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    split: str
    text: str
    schema_: GoldSchema = Field(alias="schema")
    table: GoldTable

    @model_validator(mode="after")
    def _table_matches_schema(self) -> GoldenExample:
        if self.table.names() != self.schema_.names():
            raise ValueError("table.columns must equal schema.columns (same names, same order)")
        return self

    def schema_dict(self) -> dict[str, Any]:
        return self.schema_.model_dump(exclude_none=True)

    def table_dict(self) -> dict[str, Any]:
        return self.table.model_dump(exclude_none=False)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class GoldenFormatError(ValueError):
    """A golden line that breaks docs/golden_data.md; the message is ``file:line: field: reason``."""

    def __init__(self, path: Path | str, line: int, field: str, reason: str) -> None:
        self.path, self.line, self.field, self.reason = str(path), line, field, reason
        super().__init__(f"{path}:{line}: {field}: {reason}")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(line)"


def parse_golden_line(raw: str, path: Path | str = "<string>", line: int = 1) -> GoldenExample:
    """Validate one JSONL line, raising :class:`GoldenFormatError` that names file, line and field."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise GoldenFormatError(path, line, "(line)", f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise GoldenFormatError(path, line, "(line)", f"expected a JSON object, got {type(obj).__name__}")
    try:
        return GoldenExample.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise GoldenFormatError(path, line, _loc(tuple(err["loc"])), err["msg"]) from None


def iter_golden(path: Path | str) -> Iterator[GoldenExample]:
    """Stream examples from one file; blank lines are allowed, bad lines raise."""
    p = Path(path)
    seen: dict[str, int] = {}
    with p.open("rb") as fh:
        for lineno, data in enumerate(fh, start=1):
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = data[exc.start : exc.start + 1].hex()
                reason = f"not UTF-8: byte 0x{byte} at column {exc.start + 1}"
                raise GoldenFormatError(p, lineno, "(line)", reason) from None
            if not raw.strip():
                continue
            ex = parse_golden_line(raw, p, lineno)
            if ex.id in seen:
                raise GoldenFormatError(p, lineno, "id", f"duplicate id {ex.id!r} (first on line {seen[ex.id]})")
            seen[ex.id] = lineno
            yield ex


def read_golden(path: Path | str, limit: int | None = None) -> list[GoldenExample]:
    """All examples of one file (or the first ``limit``)."""
    out: list[GoldenExample] = []
    for ex in iter_golden(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(ex)
    return out


def read_split(folder: Path | str, split: str, limit: int | None = None) -> list[GoldenExample]:
    """Examples of one split from a golden folder."""
    return read_golden(Path(folder) / golden_filename(split), limit)


def write_golden(path: Path | str, examples: Iterable[GoldenExample | dict[str, Any]]) -> int:
    """Write examples as JSONL (validating dicts first); returns the count."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for ex in examples:
            model = ex if isinstance(ex, GoldenExample) else GoldenExample.model_validate(ex)
            fh.write(json.dumps(model.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


@dataclass
class Summary:
    """min / mean / max of one quantity."""

    min: float = 0.0
    mean: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: list[int]) -> Summary:
        return cls(min(values), statistics.fmean(values), max(values)) if values else cls()


@dataclass
class SplitStats:
    """What ``validate`` reports for one file."""

    file: str
    examples: int
    columns_per_schema: Summary
    rows_per_table: Summary
    text_chars: Summary
    sources: dict[str, int] = field(default_factory=dict)


def source_of(example_id: str) -> str:
    """The data source of an id: the part before the first ``-`` (``e2e-…`` → ``e2e``)."""
    return example_id.split("-", 1)[0]


def split_stats(path: Path | str) -> SplitStats:
    """Validate a file completely and summarise it."""
    cols: list[int] = []
    rows: list[int] = []
    chars: list[int] = []
    sources: Counter[str] = Counter()
    for ex in iter_golden(path):
        cols.append(len(ex.schema_.columns))
        rows.append(len(ex.table.data))
        chars.append(len(ex.text))
        sources[source_of(ex.id)] += 1
    return SplitStats(str(path), len(cols), Summary.of(cols), Summary.of(rows), Summary.of(chars), dict(sources))


class EmptySplitError(ValueError):
    """A golden split file without a single example (nothing to train, validate or test on)."""


def validate_folder(folder: Path | str, splits: Iterable[str] = SPLITS) -> list[SplitStats]:
    """Validate every split file of a golden folder; a missing file, or one without examples, is an error."""
    out = []
    for split in splits:
        p = Path(folder) / golden_filename(split)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: golden split file is missing")
        stats = split_stats(p)
        if stats.examples == 0:
            raise EmptySplitError(f"{p}: the {split} split is empty (no examples)")
        out.append(stats)
    return out

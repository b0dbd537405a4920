"""Parse a predicted schema from model text (docs/rewards.md).

Accepted: surrounding whitespace and at most one surrounding Markdown code fence (```` ``` ```` or
```` ```json ````), then JSON in one of three shapes: ``{"columns": [...]}``, ``{"fields": [...]}``
or a bare list. Each item is ``{"name": <str>, ...}`` or a string. Anything else is invalid; the
reason is returned, never guessed around.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"\A```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)\n?[ \t]*```\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """Result of :func:`parse_schema_text`: the column names in order, or the reason it failed."""

    names: tuple[str, ...]
    valid: bool
    error: str | None = None


def strip_code_fence(text: str) -> str:
    """Remove surrounding whitespace and one surrounding code fence, if present."""
    stripped = text.strip()
    match = _FENCE.match(stripped)
    return match.group(1).strip() if match else stripped


def schema_names_from_obj(obj: Any) -> tuple[str, ...]:
    """Column names from an already-decoded schema in any accepted shape.

    Raises ``ValueError`` naming the offending part when the shape is not accepted.
    """
    if isinstance(obj, dict):
        if "columns" in obj:
            items, key = obj["columns"], "columns"
        elif "fields" in obj:
            items, key = obj["fields"], "fields"
        else:
            raise ValueError("schema object has neither 'columns' nor 'fields'")
        if not isinstance(items, list):
            raise ValueError(f"schema '{key}' must be a list, got {type(items).__name__}")
    elif isinstance(obj, list):
        items, key = obj, "list"
    else:
        raise ValueError(f"schema must be an object or a list, got {type(obj).__name__}")
    names: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            names.append(item["name"])
        else:
            raise ValueError(f"schema {key}[{i}] must be a string or an object with a string 'name'")
    return tuple(names)


def parse_schema_text(text: str) -> ParsedSchema:
    """Parse model output into column names; never raises."""
    body = strip_code_fence(text)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return ParsedSchema((), False, f"invalid JSON: {type(exc).__name__}")
    try:
        return ParsedSchema(schema_names_from_obj(obj), True)
    except ValueError as exc:
        return ParsedSchema((), False, str(exc))

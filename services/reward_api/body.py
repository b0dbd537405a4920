"""Request bodies: bytes → wire model in one pass on the common path; errors that say where and why.

Fast path: ``msgspec`` decodes and type-checks the raw body in one pass (strict JSON: no ``NaN``, no
lone surrogates, valid UTF-8). For schema, table and pipeline requests it decodes straight into the structs
below, which mirror the items of ``shared.wire`` without building a pydantic model per item (that cost
more than scoring at batch 1024); the config, one small object, goes through its pydantic model, the
single validator of reward configs. The pydantic models in ``shared.wire`` stay the contract: they give
the OpenAPI schema, and every body the fast path refuses is read again by the slow path below, so an
error answer is the same whichever path saw the body first.

Slow path, in this order:

1. not UTF-8 → 400 ``bad_request`` with the byte offset, line, column and the decoder's reason;
2. not JSON → 422 ``json_invalid`` (character offset, line, column, reason); nested deeper than the
   parser allows → 400 with the position where the nesting passes the limit;
3. a lone UTF-16 surrogate (in a key or a string) or a non-finite number anywhere → 422 naming each
   such field (``invalid_unicode`` / ``finite_number``): such strings cannot be encoded back to JSON or
   sent to the executor, and such numbers make rewards ``NaN``;
4. the pydantic model → 422 naming each bad field (``errors._invalid`` renders it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import pydantic_core
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from services.reward_api.errors import ApiError, field_path

M = TypeVar("M", bound=BaseModel)
C = TypeVar("C", bound=BaseModel)
S = TypeVar("S", bound=msgspec.Struct)


# ---- hot-path structs (mirror shared.wire / shared.golden; tests/services/reward_api/test_body.py keeps them equal)


class FastColumn(msgspec.Struct):
    name: Annotated[str, msgspec.Meta(min_length=1)]


def _unique(columns: list[FastColumn]) -> None:
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        # The slow path words the error (shared.golden.GoldSchema); here it only has to be refused.
        raise ValueError("duplicate column names")


class FastGoldSchema(msgspec.Struct):
    columns: list[FastColumn]
    table_id: str | None = None

    def __post_init__(self) -> None:
        _unique(self.columns)

    def names(self) -> list[str]:
        return [c.name for c in self.columns]


class FastGoldTable(msgspec.Struct):
    columns: list[FastColumn]
    data: list[list[str | None]]
    table_id: str | None = None

    def __post_init__(self) -> None:
        _unique(self.columns)
        n = len(self.columns)
        if any(len(row) != n for row in self.data):
            raise ValueError("row length differs from the number of columns")

    def names(self) -> list[str]:
        return [c.name for c in self.columns]


class FastSchemaItem(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    prediction: str
    gold_schema: FastGoldSchema


class FastTableItem(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    prediction: str
    gold_table: FastGoldTable


class FastPipelineItem(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    prediction: str
    text: str
    gold_schema: FastGoldSchema
    gold_table: FastGoldTable


class FastSchemaRequest(msgspec.Struct, forbid_unknown_fields=True):
    items: list[FastSchemaItem]
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    debug: bool = False


class FastTableRequest(msgspec.Struct, forbid_unknown_fields=True):
    items: list[FastTableItem]
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    debug: bool = False


class FastPipelineRequest(msgspec.Struct, forbid_unknown_fields=True):
    items: list[FastPipelineItem]
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    debug: bool = False
    on_executor_error: Literal["fail", "penalize"] = "fail"


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder(struct: type[S]) -> msgspec.json.Decoder[S]:
    dec = _DECODERS.get(struct)
    if dec is None:
        dec = _DECODERS[struct] = msgspec.json.Decoder(struct)
    return dec


# ---- reading a request -----------------------------------------------------------------------------


async def read_fast(
    request: Request, struct: type[S], model: type[M], config_model: type[C]
) -> tuple[S, C] | tuple[M, C]:
    """The body as ``struct`` and its validated config. A body the fast path refuses is read by the slow
    path: its error, or the pydantic model where pydantic's lax rules accept more (``"debug": "yes"``)."""
    raw = await request.body()
    try:
        fast = _decoder(struct).decode(raw)
        return fast, config_model.model_validate(fast.config)  # type: ignore[attr-defined]
    except (ValueError, RecursionError):  # msgspec's errors, pydantic's and UnicodeDecodeError are ValueErrors
        slow = parse_slow(raw, model)
        return slow, slow.config  # type: ignore[attr-defined]


def parse_slow(raw: bytes, model: type[M]) -> M:
    """Steps 1-4 of the module docstring: the model, or the error that says where and why."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(raw, exc.start)
        raise ApiError(
            400,
            "bad_request",
            {
                "field": "body",
                "message": f"invalid UTF-8 at byte {exc.start} (line {line}, column {col}): {exc.reason}",
                "byte_offset": exc.start,
                "line": line,
                "column": col,
            },
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", exc.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": f"{exc.msg} (line {exc.lineno}, column {exc.colno})"},
                }
            ]
        ) from None
    except RecursionError:
        raise ApiError(400, "bad_request", _too_deep(raw)) from None
    bad = list(_odd_values(obj))
    if bad:
        raise ApiError(422, "invalid_request", bad)
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _line_col(raw: bytes, offset: int) -> tuple[int, int]:
    line = raw.count(b"\n", 0, offset) + 1
    return line, offset - (raw.rfind(b"\n", 0, offset) + 1) + 1


def _too_deep(raw: bytes) -> dict[str, Any]:
    """Where the nesting passes the limit: pydantic-core's JSON parser reports it with a position (its
    limit is lower than Python's, so it stops at the first level past its own)."""
    where = ""
    try:
        pydantic_core.from_json(raw)
    except ValueError as exc:
        where = str(exc)
    return {
        "field": "body",
        "message": f"arrays/objects nested deeper than the JSON parser allows ({where or 'position unknown'}); "
        "a reward request nests at most a few levels",
    }


def _odd_values(obj: Any) -> Iterator[dict[str, str]]:
    """Lone surrogates and non-finite numbers, each named by its path (iterative: the body may nest as
    deep as ``json.loads`` allows, deeper than this function could recurse)."""
    stack: list[tuple[tuple[int | str, ...], Any]] = [(("body",), obj)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, str):
            if _has_surrogate(value):
                yield _odd(loc, value, "invalid_unicode")
        elif isinstance(value, float):
            if not math.isfinite(value):
                yield _odd(loc, value, "finite_number")
        elif isinstance(value, dict):
            for k, v in reversed(value.items()):
                key = k
                if _has_surrogate(k):
                    # The path must itself be encodable: the surrogate is written as its escape.
                    key = k.encode("utf-8", "backslashreplace").decode()
                    yield _odd((*loc, key), k, "invalid_unicode")
                stack.append(((*loc, key), v))
        elif isinstance(value, list):
            stack.extend(((*loc, i), v) for i, v in reversed(list(enumerate(value))))


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _odd(loc: tuple[int | str, ...], value: Any, kind: str) -> dict[str, str]:
    if kind == "finite_number":
        return {"field": field_path(loc), "message": "Input should be a finite number", "type": kind}
    pos = next(i for i, ch in enumerate(value) if 0xD800 <= ord(ch) <= 0xDFFF)
    return {
        "field": field_path(loc),
        "message": f"lone UTF-16 surrogate \\u{ord(value[pos]):04x} at character {pos}: strings must be valid "
        "Unicode (a surrogate is only valid as half of a \\uD8xx\\uDCxx pair)",
        "type": kind,
    }

"""Schema precision / recall / F1 over sets of normalised column names (docs/rewards.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from shared.names import normalize_name
from shared.schema_parsing import ParsedSchema, parse_schema_text, schema_names_from_obj


@dataclass(frozen=True, slots=True)
class SchemaPRF:
    """Set-based P/R/F1 of predicted against gold column names."""

    precision: float
    recall: float
    f1: float
    valid_json: bool
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def name_set(names: Iterable[str]) -> frozenset[str]:
    """Normalised, de-duplicated names; names that normalise to nothing are dropped."""
    return frozenset(n for n in (normalize_name(x) for x in names) if n)


def prf(pred: frozenset[str], gold: frozenset[str]) -> tuple[float, float, float]:
    """Set P/R/F1. Empty vs empty counts as a perfect match; empty vs non-empty scores 0."""
    if not pred and not gold:
        return 1.0, 1.0, 1.0
    tp = len(pred & gold)
    precision = tp / len(pred) if pred else 0.0
    recall = tp / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def gold_schema_names(gold_schema: Mapping[str, Any] | list[Any]) -> tuple[str, ...]:
    """Column names of a gold schema, in any accepted shape (``columns`` / ``fields`` / list)."""
    return schema_names_from_obj(gold_schema)


def schema_prf_from_text(pred_text: str, gold_schema: Mapping[str, Any] | list[Any]) -> SchemaPRF:
    """Score a predicted schema text against a gold schema.

    precision = |P∩G|/|P|, recall = |P∩G|/|G|, f1 = 2PR/(P+R), where P and G are the sets of
    normalised names. An unparseable prediction gives ``valid_json=False`` and zeros.
    """
    return schema_prf(parse_schema_text(pred_text), gold_schema)


def schema_prf(parsed: ParsedSchema, gold_schema: Mapping[str, Any] | list[Any]) -> SchemaPRF:
    """:func:`schema_prf_from_text` on a prediction already parsed (``parse_schema_text``)."""
    if not parsed.valid:
        return SchemaPRF(0.0, 0.0, 0.0, False, parsed.error)
    p, r, f = prf(name_set(parsed.names), name_set(gold_schema_names(gold_schema)))
    return SchemaPRF(p, r, f, True)

"""Order-invariant table metrics, reported beside the seed's reward (DESIGN §4.3).

Rows are aligned one-to-one with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``)
so that a correct table in another row order scores as correct. The metrics follow the spirit of
Wu et al. 2022 (Text-to-Table): header F1 and non-empty cell F1, each with *exact* matching
(``str(v).strip()``) and *normalised* matching (case-folded, whitespace collapsed, outer
punctuation dropped; column names through :func:`shared.names.normalize_name`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from shared.names import normalize_name
from shared.schema_metrics import prf
from shared.table_metrics import normalize_cell

_SPACE_RUN = re.compile(r"\s+")
_OUTER_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")

CellNorm = Callable[[Any], str]
KeyNorm = Callable[[str], str]


def loose_cell(value: Any) -> str:
    """Normalised cell form: case-folded, inner whitespace collapsed, outer punctuation dropped."""
    return _OUTER_PUNCT.sub("", _SPACE_RUN.sub(" ", normalize_cell(value).casefold()))


def _identity(key: str) -> str:
    return key


@dataclass(frozen=True, slots=True)
class AlignedMetrics:
    """Order-invariant metrics of one predicted table against its gold table."""

    aligned_cell_accuracy: float
    row_exact_match: float
    cell_precision: float
    cell_recall: float
    cell_f1: float
    cell_f1_normalized: float
    column_header_f1: float
    column_header_f1_normalized: float

    def as_dict(self) -> dict[str, float]:
        """Field by field: the values are flat floats, and ``dataclasses.asdict`` (which deep-copies each)
        was ~13% of a table request's server time at batch 1024 (bench/results/local_rewards_profile.md)."""
        return {name: getattr(self, name) for name in _ALIGNED_FIELDS}


_ALIGNED_FIELDS = tuple(f.name for f in fields(AlignedMetrics))


def _cells(row: Mapping[str, Any], key_norm: KeyNorm, cell_norm: CellNorm) -> dict[str, str]:
    """Non-empty cells of a row, keyed by normalised column name."""
    out: dict[str, str] = {}
    for key, value in row.items():
        v = cell_norm(value)
        if v:
            out[key_norm(key)] = v
    return out


def _pair_stats(pred: dict[str, str], gold: dict[str, str]) -> tuple[int, int]:
    """(matching non-empty cells, union of keys) for one aligned pair."""
    matches = sum(1 for k, v in pred.items() if gold.get(k) == v)
    return matches, len(pred.keys() | gold.keys())


def align_rows(pred: Sequence[dict[str, str]], gold: Sequence[dict[str, str]]) -> list[tuple[int, int]]:
    """One-to-one (pred, gold) row pairs maximising the number of matching non-empty cells.

    Ties go to the positional pairing: a tiny bonus on the diagonal keeps the seed's order when
    content does not decide.
    """
    if not pred or not gold:
        return []
    score = np.zeros((len(pred), len(gold)))
    for i, p in enumerate(pred):
        for j, g in enumerate(gold):
            score[i, j] = _pair_stats(p, g)[0] + (1e-6 if i == j else 0.0)
    rows, cols = linear_sum_assignment(score, maximize=True)
    return list(zip(rows.tolist(), cols.tolist(), strict=True))


def _cell_prf(
    pred_rows: Sequence[Mapping[str, Any]],
    gold_rows: Sequence[Mapping[str, Any]],
    key_norm: KeyNorm,
    cell_norm: CellNorm,
) -> tuple[float, float, float, float, float, list[tuple[int, int]]]:
    pred = [_cells(r, key_norm, cell_norm) for r in pred_rows]
    gold = [_cells(r, key_norm, cell_norm) for r in gold_rows]
    pairs = align_rows(pred, gold)
    tp = exact_rows = 0
    correct_union = union_total = 0
    for i, j in pairs:
        m, u = _pair_stats(pred[i], gold[j])
        tp += m
        correct_union += m
        union_total += u
        exact_rows += pred[i] == gold[j]
    n_pred = sum(len(r) for r in pred)
    n_gold = sum(len(r) for r in gold)
    # Unpaired rows count in full: their cells are all wrong.
    paired_p = {i for i, _ in pairs}
    paired_g = {j for _, j in pairs}
    union_total += sum(len(r) for k, r in enumerate(pred) if k not in paired_p)
    union_total += sum(len(r) for k, r in enumerate(gold) if k not in paired_g)
    if n_pred == 0 and n_gold == 0:
        precision = recall = f1 = 1.0
    else:
        precision = tp / n_pred if n_pred else 0.0
        recall = tp / n_gold if n_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = correct_union / union_total if union_total else 1.0
    n_rows = max(len(pred), len(gold))
    row_exact = exact_rows / n_rows if n_rows else 1.0
    return precision, recall, f1, accuracy, row_exact, pairs


def _header_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def aligned_table_metrics(
    pred_rows: Sequence[Mapping[str, Any]],
    gold_rows: Sequence[Mapping[str, Any]],
    gold_columns: Sequence[str] | None = None,
) -> AlignedMetrics:
    """All order-invariant metrics for one table.

    - ``aligned_cell_accuracy``: after alignment, matching non-empty cells / union of non-empty
      (row, column) cells on both sides (unpaired rows count in full); 1.0 when both are empty.
    - ``row_exact_match``: aligned pairs whose non-empty cells are identical / max(#pred, #gold).
    - ``cell_precision/recall/f1``: over (aligned row, column, value) triples of non-empty cells,
      exact matching; ``cell_f1_normalized`` the same with normalised names and values.
    - ``column_header_f1``: set F1 of predicted keys (over all rows) vs gold columns, exact;
      ``column_header_f1_normalized`` with :func:`normalize_name`.
    """
    precision, recall, f1, accuracy, row_exact, _ = _cell_prf(pred_rows, gold_rows, _identity, normalize_cell)
    _, _, f1_norm, _, _, _ = _cell_prf(pred_rows, gold_rows, normalize_name, loose_cell)
    gold_cols = list(gold_columns) if gold_columns is not None else _header_names(gold_rows)
    pred_cols = _header_names(pred_rows)
    _, _, header_f1 = prf(frozenset(pred_cols), frozenset(gold_cols))
    _, _, header_f1_norm = prf(
        frozenset(filter(None, map(normalize_name, pred_cols))),
        frozenset(filter(None, map(normalize_name, gold_cols))),
    )
    return AlignedMetrics(accuracy, row_exact, precision, recall, f1, f1_norm, header_f1, header_f1_norm)

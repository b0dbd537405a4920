"""Order-invariant table metrics: the default table reward and Phase D's headline (docs/rewards.md).

Rows are aligned one-to-one with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``)
so that a correct table in another row order scores as correct. The metrics follow the spirit of
Wu et al. 2022 (Text-to-Table): header F1 and non-empty cell F1. Cell metrics always compare column
names through :func:`shared.names.normalize_name` (the schema metric's normalisation, so a value under
``number of deaths`` matches the gold ``number_of_deaths``) and values either *exactly*
(:func:`shared.table_metrics.normalize_cell`) or *normalised* (case-folded, whitespace collapsed, outer
punctuation dropped). Only non-empty cells count: an empty or ``null`` cell earns nothing and costs
nothing, so padding a table with null columns cannot raise any of these numbers.

Within a row, two keys with the same normalised name keep the first non-empty value; the others are
dropped on both sides (so a prediction cannot place two guesses under one column).

Cost is bounded: the match matrix is built from an inverted index of gold cells (numpy, no Python call
per row pair), and the Hungarian solver sees at most ``max_align_rows`` rows of each side; rows past
that cap are paired in linear time, identical rows first, then in order (``DEFAULT_MAX_ALIGN_ROWS``;
gold tables in the golden data have at most 6 rows, so the cap only bounds what hostile input costs).
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

DEFAULT_MAX_ALIGN_ROWS = 256
_TIE_BONUS = 1e-6  # on the diagonal: ties keep the positional pairing

_SPACE_RUN = re.compile(r"\s+")
_OUTER_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")

CellNorm = Callable[[Any], str]
KeyNorm = Callable[[str], str]


def loose_cell(value: Any) -> str:
    """Normalised cell form: case-folded, inner whitespace collapsed, outer punctuation dropped."""
    return _OUTER_PUNCT.sub("", _SPACE_RUN.sub(" ", normalize_cell(value).casefold()))


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
    """Non-empty cells of a row, keyed by normalised column name; the first non-empty value of a
    normalised name wins."""
    out: dict[str, str] = {}
    for key, value in row.items():
        v = cell_norm(value)
        if v:
            out.setdefault(key_norm(key), v)
    return out


def _pair_stats(pred: dict[str, str], gold: dict[str, str]) -> tuple[int, int]:
    """(matching non-empty cells, union of keys) for one aligned pair."""
    matches = sum(1 for k, v in pred.items() if gold.get(k) == v)
    return matches, len(pred.keys() | gold.keys())


def match_matrix(pred: Sequence[dict[str, str]], gold: Sequence[dict[str, str]]) -> np.ndarray:
    """``M[i, j]`` = matching cells of pred row ``i`` and gold row ``j``, from an inverted index of the
    gold cells: one numpy update per predicted cell instead of one Python call per row pair."""
    index: dict[tuple[str, str], list[int]] = {}
    for j, g in enumerate(gold):
        for cell in g.items():
            index.setdefault(cell, []).append(j)
    score = np.zeros((len(pred), len(gold)))
    for i, p in enumerate(pred):
        for cell in p.items():
            js = index.get(cell)
            if js:
                score[i, js] += 1.0
    return score


def align_rows(
    pred: Sequence[dict[str, str]], gold: Sequence[dict[str, str]], max_rows: int = DEFAULT_MAX_ALIGN_ROWS
) -> list[tuple[int, int]]:
    """One-to-one (pred, gold) row pairs maximising the number of matching non-empty cells.

    Ties go to the positional pairing: a tiny bonus on the diagonal keeps the rows' order when
    content does not decide. Only the first ``max_rows`` rows of each side go to the solver (it is
    cubic in the rows); the rest are paired in linear time, identical rows first, then in order.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if not pred or not gold:
        return []
    p, g = min(len(pred), max_rows), min(len(gold), max_rows)
    score = match_matrix(pred[:p], gold[:g])
    k = min(p, g)
    score[np.arange(k), np.arange(k)] += _TIE_BONUS
    rows, cols = linear_sum_assignment(score, maximize=True)
    pairs = list(zip(rows.tolist(), cols.tolist(), strict=True))
    if len(pred) <= max_rows and len(gold) <= max_rows:
        return pairs
    # Past the cap, a solver pair with no matching cell may belong to a row the solver never saw: free it.
    pairs = [(i, j) for i, j in pairs if score[i, j] >= 1.0]
    return pairs + _pair_past_the_cap(pred, gold, {i for i, _ in pairs}, {j for _, j in pairs})


def _pair_past_the_cap(
    pred: Sequence[dict[str, str]], gold: Sequence[dict[str, str]], used_p: set[int], used_g: set[int]
) -> list[tuple[int, int]]:
    """Rows the solver did not see (past ``max_rows``) in linear time: identical rows first (so a correct
    row scores in any order), then the rest in order."""
    free_g: dict[frozenset[tuple[str, str]], list[int]] = {}
    for j in range(len(gold)):
        if j not in used_g:
            free_g.setdefault(frozenset(gold[j].items()), []).append(j)
    pairs, rest_p = [], []
    for i in range(len(pred)):
        if i in used_p:
            continue
        same = free_g.get(frozenset(pred[i].items()))
        if same:
            pairs.append((i, same.pop(0)))
        else:
            rest_p.append(i)
    rest_g = sorted(j for js in free_g.values() for j in js)
    return pairs + list(zip(rest_p, rest_g, strict=False))


def _cell_prf(
    pred_rows: Sequence[Mapping[str, Any]],
    gold_rows: Sequence[Mapping[str, Any]],
    key_norm: KeyNorm,
    cell_norm: CellNorm,
    max_rows: int = DEFAULT_MAX_ALIGN_ROWS,
) -> tuple[float, float, float, float, float, list[tuple[int, int]]]:
    pred = [_cells(r, key_norm, cell_norm) for r in pred_rows]
    gold = [_cells(r, key_norm, cell_norm) for r in gold_rows]
    pairs = align_rows(pred, gold, max_rows)
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


def aligned_cell_f1(
    pred_rows: Sequence[Mapping[str, Any]],
    gold_rows: Sequence[Mapping[str, Any]],
    max_align_rows: int = DEFAULT_MAX_ALIGN_ROWS,
) -> float:
    """The default table reward's score: ``cell_f1`` of :func:`aligned_table_metrics` alone."""
    return _cell_prf(pred_rows, gold_rows, normalize_name, normalize_cell, max_align_rows)[2]


def aligned_table_metrics(
    pred_rows: Sequence[Mapping[str, Any]],
    gold_rows: Sequence[Mapping[str, Any]],
    gold_columns: Sequence[str] | None = None,
    max_align_rows: int = DEFAULT_MAX_ALIGN_ROWS,
) -> AlignedMetrics:
    """All order-invariant metrics for one table (cell names always through :func:`normalize_name`).

    - ``aligned_cell_accuracy``: after alignment, matching non-empty cells / union of non-empty
      (row, column) cells on both sides (unpaired rows count in full); 1.0 when both are empty.
    - ``row_exact_match``: aligned pairs whose non-empty cells are identical / max(#pred, #gold).
    - ``cell_precision/recall/f1``: over (aligned row, column, value) triples of non-empty cells,
      exact values; 1.0 when neither side has a non-empty cell. ``cell_f1`` is the default table
      reward's score. ``cell_f1_normalized``: the same with normalised values.
    - ``column_header_f1``: set F1 of predicted keys (over all rows) vs gold columns, exact;
      ``column_header_f1_normalized`` with :func:`normalize_name`.
    """
    cap = max_align_rows
    precision, recall, f1, accuracy, row_exact, _ = _cell_prf(pred_rows, gold_rows, normalize_name, normalize_cell, cap)
    _, _, f1_norm, _, _, _ = _cell_prf(pred_rows, gold_rows, normalize_name, loose_cell, cap)
    gold_cols = list(gold_columns) if gold_columns is not None else _header_names(gold_rows)
    pred_cols = _header_names(pred_rows)
    _, _, header_f1 = prf(frozenset(pred_cols), frozenset(gold_cols))
    _, _, header_f1_norm = prf(
        frozenset(filter(None, map(normalize_name, pred_cols))),
        frozenset(filter(None, map(normalize_name, gold_cols))),
    )
    return AlignedMetrics(accuracy, row_exact, precision, recall, f1, f1_norm, header_f1, header_f1_norm)

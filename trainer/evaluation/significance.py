"""Uncertainty of Phase-D numbers: 95% bootstrap intervals and paired bootstrap tests over documents.

Phase D scores every test document once per setting, so a mean's uncertainty comes from which
documents were drawn. Intervals resample documents with replacement (percentile method); a paired
test resamples the *same* documents for both settings, so the per-document difference is what
varies. Seeds are fixed: the same predictions always give the same intervals and p-values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

N_RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


def _resample_means(values: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_resamples, len(values)))
    means: np.ndarray = values[idx].mean(axis=1)
    return means


def bootstrap_ci(
    values: Sequence[float], level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (a single value gives a point)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("bootstrap_ci: no values")
    if not np.all(np.isfinite(arr)):
        raise ValueError("bootstrap_ci: values must be finite")
    means = _resample_means(arr, n_resamples, seed)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


@dataclass(frozen=True)
class PairedTest:
    """``treatment`` − ``baseline`` on one metric over the documents both settings scored."""

    baseline: str
    treatment: str
    metric: str
    n: int
    baseline_mean: float
    treatment_mean: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float  # two-sided: how often the resampled difference falls on the other side of 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_bootstrap(
    baseline: Sequence[float],
    treatment: Sequence[float],
    *,
    names: tuple[str, str] = ("baseline", "treatment"),
    metric: str = "",
    level: float = LEVEL,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> PairedTest:
    """Paired bootstrap of mean(treatment − baseline); the inputs are per-document values in one order."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(treatment, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired_bootstrap: need equal, non-empty sequences (got {a.size} and {b.size})")
    diffs = _resample_means(b - a, n_resamples, seed)
    alpha = (1.0 - level) / 2.0
    below, above = float(np.mean(diffs <= 0.0)), float(np.mean(diffs >= 0.0))
    return PairedTest(
        baseline=names[0],
        treatment=names[1],
        metric=metric,
        n=int(a.size),
        baseline_mean=float(a.mean()),
        treatment_mean=float(b.mean()),
        diff=float((b - a).mean()),
        ci_low=float(np.quantile(diffs, alpha)),
        ci_high=float(np.quantile(diffs, 1.0 - alpha)),
        p_value=min(1.0, 2.0 * min(below, above)),
    )


def intervals(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """95% intervals of every metric in ``keys`` that the rows hold, overall and per data source."""

    def of(group: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for key in keys:
            vals = [float(r[key]) for r in group if key in r]
            if vals:
                out[key] = [round(v, 6) for v in bootstrap_ci(vals)]
        return out

    sources = sorted({str(r["source"]) for r in rows})
    return {"overall": of(rows), "per_source": {s: of([r for r in rows if r["source"] == s]) for s in sources}}


def paired_tests(
    rows: Mapping[str, Sequence[Mapping[str, Any]]], pairs: Sequence[tuple[str, str]], metric: str
) -> list[dict[str, Any]]:
    """A paired test per (baseline, treatment) pair whose settings both hold ``metric``; documents by id."""
    out: list[dict[str, Any]] = []
    for base, treat in pairs:
        if base not in rows or treat not in rows:
            continue
        a = {str(r["id"]): float(r[metric]) for r in rows[base] if metric in r}
        b = {str(r["id"]): float(r[metric]) for r in rows[treat] if metric in r}
        ids = sorted(a.keys() & b.keys())
        if not ids:
            continue
        test = paired_bootstrap([a[i] for i in ids], [b[i] for i in ids], names=(base, treat), metric=metric)
        out.append(test.as_dict())
    return out

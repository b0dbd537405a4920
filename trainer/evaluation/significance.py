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
    return _paired_test(names, metric, int(a.size), float(a.mean()), float(b.mean()), diffs, level)


def _paired_test(
    names: tuple[str, str], metric: str, n: int, base_mean: float, treat_mean: float, diffs: np.ndarray, level: float
) -> PairedTest:
    """The test from the resampled mean differences: percentile interval, two-sided p."""
    alpha = (1.0 - level) / 2.0
    below, above = float(np.mean(diffs <= 0.0)), float(np.mean(diffs >= 0.0))
    return PairedTest(
        baseline=names[0],
        treatment=names[1],
        metric=metric,
        n=n,
        baseline_mean=base_mean,
        treatment_mean=treat_mean,
        diff=treat_mean - base_mean,
        ci_low=float(np.quantile(diffs, alpha)),
        ci_high=float(np.quantile(diffs, 1.0 - alpha)),
        p_value=min(1.0, 2.0 * min(below, above)),
    )


def _stratified_macro_means(groups: Sequence[np.ndarray], n_resamples: int, seed: int) -> np.ndarray:
    """Resampled macro means: each source resampled within itself, then the sources averaged."""
    rng = np.random.default_rng(seed)
    total = np.zeros(n_resamples)
    for values in groups:
        idx = rng.integers(0, len(values), size=(n_resamples, len(values)))
        total += values[idx].mean(axis=1)
    return total / len(groups)


def macro_ci(
    groups: Sequence[Sequence[float]], level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """Interval of the macro mean (unweighted mean of the per-source means), resampling within sources."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("macro_ci: every source needs at least one value")
    means = _stratified_macro_means(arrays, n_resamples, seed)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


def macro_paired_bootstrap(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    names: tuple[str, str] = ("baseline", "treatment"),
    metric: str = "",
    level: float = LEVEL,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> PairedTest:
    """Paired bootstrap of the macro mean difference: per source (baseline, treatment) values in one order;
    documents are resampled within their source."""
    diffs_by_source = []
    for a, b in pairs:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if x.shape != y.shape or x.size == 0:
            raise ValueError(f"macro_paired_bootstrap: need equal, non-empty sequences (got {x.size} and {y.size})")
        diffs_by_source.append(y - x)
    means = _stratified_macro_means(diffs_by_source, n_resamples, seed)
    base_mean = float(np.mean([np.mean(a) for a, _ in pairs]))
    treat_mean = float(np.mean([np.mean(b) for _, b in pairs]))
    return _paired_test(names, metric, sum(len(a) for a, _ in pairs), base_mean, treat_mean, means, level)


def intervals(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """95% intervals of every metric in ``keys`` that the rows hold: pooled, per data source, and of the
    macro mean over sources (resampled within each source)."""

    def of(group: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for key in keys:
            vals = [float(r[key]) for r in group if key in r]
            if vals:
                out[key] = [round(v, 6) for v in bootstrap_ci(vals)]
        return out

    sources = sorted({str(r["source"]) for r in rows})
    by_source = {s: [r for r in rows if r["source"] == s] for s in sources}
    macro: dict[str, list[float]] = {}
    for key in keys:
        groups = [[float(r[key]) for r in g if key in r] for g in by_source.values()]
        if groups and all(groups):
            macro[key] = [round(v, 6) for v in macro_ci(groups)]
    return {"overall": of(rows), "per_source": {s: of(g) for s, g in by_source.items()}, "macro": macro}


def paired_tests(
    rows: Mapping[str, Sequence[Mapping[str, Any]]], pairs: Sequence[tuple[str, str]], metric: str
) -> list[dict[str, Any]]:
    """Paired tests per (baseline, treatment) pair whose settings both hold ``metric``, documents by id:
    the pooled mean (``scope`` "pooled") and, with several sources, the macro mean over sources ("macro")
    and each source (its name)."""
    out: list[dict[str, Any]] = []
    for base, treat in pairs:
        if base not in rows or treat not in rows:
            continue
        a = {str(r["id"]): (str(r.get("source", "")), float(r[metric])) for r in rows[base] if metric in r}
        b = {str(r["id"]): float(r[metric]) for r in rows[treat] if metric in r}
        ids = sorted(a.keys() & b.keys())
        if not ids:
            continue
        by_source: dict[str, list[str]] = {}
        for i in ids:
            by_source.setdefault(a[i][0], []).append(i)
        names = (base, treat)
        if len(by_source) > 1:
            groups = [([a[i][1] for i in g], [b[i] for i in g]) for g in by_source.values()]
            out.append({"scope": "macro", **macro_paired_bootstrap(groups, names=names, metric=metric).as_dict()})
        pooled = paired_bootstrap([a[i][1] for i in ids], [b[i] for i in ids], names=names, metric=metric)
        out.append({"scope": "pooled", **pooled.as_dict()})
        for src in sorted(by_source) if len(by_source) > 1 else ():
            g = by_source[src]
            test = paired_bootstrap([a[i][1] for i in g], [b[i] for i in g], names=names, metric=metric)
            out.append({"scope": src, **test.as_dict()})
    return out


def mean_over_seeds(seeds: Sequence[Sequence[Mapping[str, Any]]], metric: str) -> list[dict[str, Any]]:
    """One row per document that every seed scored (``id``, ``source``, ``metric``): its metric averaged over
    the seeds. Paired tests on these rows count each document once, whatever the number of seeds; pooling
    the seeds' rows as if each were its own document would count it once per seed and narrow the interval
    although the documents are the same."""
    values: dict[str, list[float]] = {}
    source: dict[str, str] = {}
    for rows in seeds:
        for r in rows:
            if metric in r:
                values.setdefault(str(r["id"]), []).append(float(r[metric]))
                source[str(r["id"])] = str(r.get("source", ""))
    return [{"id": i, "source": source[i], metric: sum(v) / len(v)} for i, v in values.items() if len(v) == len(seeds)]

"""Bootstrap intervals and paired tests: coverage, determinism, and the direction of a real effect."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.evaluation.significance import bootstrap_ci, intervals, mean_over_seeds, paired_bootstrap, paired_tests


def test_interval_contains_the_mean_and_narrows_with_more_documents() -> None:
    rng = np.random.default_rng(1)
    small = rng.uniform(0, 1, 50).tolist()
    large = rng.uniform(0, 1, 2000).tolist()
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_s <= float(np.mean(small)) <= hi_s
    assert lo_l <= float(np.mean(large)) <= hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s) / 3  # ~ 1/sqrt(n): 40× the documents, ~6× narrower
    # about ±1.96·sd/sqrt(n) for a uniform(0, 1): sd ≈ 0.289
    assert (hi_l - lo_l) == pytest.approx(2 * 1.96 * 0.289 / np.sqrt(2000), rel=0.2)


def test_same_input_gives_the_same_interval() -> None:
    vals = [0.0, 1.0, 1.0, 0.5, 0.25] * 20
    assert bootstrap_ci(vals) == bootstrap_ci(vals)


def test_constant_values_give_a_point() -> None:
    assert bootstrap_ci([0.7] * 30) == pytest.approx((0.7, 0.7))


@pytest.mark.parametrize("bad", [[], [float("nan"), 1.0]])
def test_bad_values_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        bootstrap_ci(bad)


def test_paired_test_finds_a_consistent_gain_that_unpaired_noise_would_hide() -> None:
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 300)
    treat = np.clip(base + 0.02, 0, 1)  # +2 points on (almost) every document, large spread between documents
    t = paired_bootstrap(base.tolist(), treat.tolist(), names=("local", "pipe"), metric="aligned_cell_f1")
    assert t.diff == pytest.approx(float(np.mean(treat - base)))
    assert 0 < t.ci_low <= t.diff <= t.ci_high
    assert t.p_value < 0.01
    assert (t.baseline, t.treatment, t.n) == ("local", "pipe", 300)


def test_paired_test_of_no_effect_is_not_significant() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 400)
    treat = base + rng.normal(0, 0.05, 400)  # noise around zero
    t = paired_bootstrap(base.tolist(), treat.tolist())
    assert t.ci_low < 0 < t.ci_high
    assert t.p_value > 0.05


def test_paired_test_needs_equal_lengths() -> None:
    with pytest.raises(ValueError, match="equal"):
        paired_bootstrap([1.0, 0.0], [1.0])


def test_rows_are_paired_by_id_not_by_position() -> None:
    a = [{"id": "x", "source": "e2e", "m": 0.0}, {"id": "y", "source": "e2e", "m": 1.0}]
    b = [{"id": "y", "source": "e2e", "m": 1.0}, {"id": "x", "source": "e2e", "m": 0.0}]  # same values, reordered
    (t,) = paired_tests({"sft": a, "local": b}, [("sft", "local")], "m")
    assert t["diff"] == 0.0 and t["n"] == 2
    assert paired_tests({"sft": a}, [("sft", "local")], "m") == []  # a missing setting is skipped


def test_intervals_overall_and_per_source() -> None:
    rows = [{"id": str(i), "source": "e2e" if i % 2 else "rotowire", "f1": float(i % 3 == 0)} for i in range(60)]
    ci = intervals(rows, ("f1", "absent"))
    assert set(ci["overall"]) == {"f1"}
    assert set(ci["per_source"]) == {"e2e", "rotowire"}
    lo, hi = ci["overall"]["f1"]
    assert lo <= 20 / 60 <= hi


def test_macro_interval_and_paired_test_weigh_every_source_the_same() -> None:
    from trainer.evaluation.significance import macro_ci

    big = [1.0] * 90 + [0.0] * 10  # mean 0.9
    small = [0.0] * 9 + [1.0]  # mean 0.1
    lo, hi = macro_ci([big, small])
    assert lo <= 0.5 <= hi and hi - lo > 0  # macro 0.5, pooled would be 0.827
    rows_a = [{"id": f"b{i}", "source": "big", "m": v} for i, v in enumerate(big)]
    rows_a += [{"id": f"s{i}", "source": "small", "m": v} for i, v in enumerate(small)]
    rows_b = [{**r, "m": 1.0} if r["source"] == "small" else dict(r) for r in rows_a]  # gain only on small
    tests = {t["scope"]: t for t in paired_tests({"a": rows_a, "b": rows_b}, [("a", "b")], "m")}
    assert tests["macro"]["diff"] == pytest.approx(0.9 / 2) and tests["pooled"]["diff"] == pytest.approx(9 / 110)
    assert tests["big"]["diff"] == 0.0 and tests["small"]["diff"] == pytest.approx(0.9)
    assert tests["macro"]["ci_low"] > 0


def test_mean_over_seeds_averages_each_document_that_every_seed_scored() -> None:
    seed0 = [{"id": "a", "source": "s", "f1": 1.0}, {"id": "b", "source": "s", "f1": 0.0}, {"id": "c", "f1": 0.5}]
    seed1 = [{"id": "a", "source": "s", "f1": 0.5}, {"id": "b", "source": "s", "f1": 1.0}]
    rows = {r["id"]: r for r in mean_over_seeds([seed0, seed1], "f1")}
    assert set(rows) == {"a", "b"}  # c is in one seed only
    assert rows["a"] == {"id": "a", "source": "s", "f1": 0.75} and rows["b"]["f1"] == 0.5
    # paired on the means, each document once
    tests = paired_tests({"x": list(rows.values()), "y": [{**r, "f1": r["f1"] + 0.1} for r in rows.values()]},
                         [("x", "y")], "f1")  # fmt: skip
    assert tests[0]["n"] == 2 and tests[0]["diff"] == pytest.approx(0.1)

"""Early stopping: the decision logic, its state file, and that the VERL hook really ends fit()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.phase_rules.early_stopping import (
    EarlyStopper,
    EarlyStoppingConfig,
    checkpoint_steps,
    metric_value,
    phase_score,
    prune_checkpoints,
    read_state,
)


def cfg(**kw: Any) -> EarlyStoppingConfig:
    base: dict[str, Any] = {"data_source": "table", "metrics": {"cell_accuracy": 1.0}, "patience": 2, "min_delta": 0.01}
    return EarlyStoppingConfig.from_mapping({**base, **kw})


def val(acc: float, ds: str = "table", key: str = "cell_accuracy", n: int = 1) -> dict[str, float]:
    return {f"val-aux/{ds}/{key}/mean@{n}": acc, f"val-core/{ds}/reward/mean@{n}": 2 * acc - 1}


def test_metric_value_takes_largest_n_and_names_missing() -> None:
    m = {"val-aux/table/cell_accuracy/mean@1": 0.2, "val-aux/table/cell_accuracy/mean@4": 0.6, "x": 1.0}
    assert metric_value(m, "table", "cell_accuracy") == 0.6
    with pytest.raises(KeyError, match=r"val-\*/schema/f1/mean@N; have \['val-aux/table"):
        metric_value(m, "schema", "f1")


def test_phase_score_is_weighted_mean() -> None:
    c = EarlyStoppingConfig.from_mapping({"data_source": "schema", "metrics": {"f1": 1.0, "valid_json": 0.25}})
    m = {"val-aux/schema/f1/mean@1": 0.5, "val-aux/schema/valid_json/mean@1": 1.0}
    assert phase_score(c, m) == pytest.approx((0.5 + 0.25) / 1.25)


def test_plateau_stops_after_patience_and_keeps_best(tmp_path: Path) -> None:
    stopper = EarlyStopper(cfg(), tmp_path / "es.json")
    decisions = [stopper.update(step, val(acc)) for step, acc in [(0, 0.1), (10, 0.3), (20, 0.305), (30, 0.30)]]
    # 0.305 is no *progress* (gain 0.005 < min_delta 0.01) but it is the best checkpoint
    assert [d.improved for d in decisions] == [True, True, False, False]
    assert [d.stop for d in decisions] == [False, False, False, True]
    assert decisions[-1].best_step == 20 and decisions[-1].best_score == pytest.approx(0.305)
    st = read_state(tmp_path / "es.json")
    assert st.stopped and st.stop_step == 30 and st.best_step == 20 and len(st.history) == 4


def test_small_gains_keep_the_best_checkpoint_but_spend_patience(tmp_path: Path) -> None:
    """Patience counts from the last real progress; the best step is the highest score, whatever min_delta says."""
    stopper = EarlyStopper(cfg(patience=3, min_delta=0.01))
    steps = [(1, 0.30), (2, 0.304), (3, 0.308), (4, 0.309)]  # each beats the last, none by > 0.01 over 0.30
    decisions = [stopper.update(s, val(a)) for s, a in steps]
    assert [d.improved for d in decisions] == [True, False, False, False]
    assert [d.best_step for d in decisions] == [1, 2, 3, 4]
    assert decisions[-1].stop  # three validations without progress over 0.30
    assert stopper.state.patience_ref == pytest.approx(0.30)


def test_a_revalidated_step_spends_no_patience(tmp_path: Path) -> None:
    """VERL re-validates the resumed step (val_before_train): the same step is scored once."""
    path = tmp_path / "es.json"
    s1 = EarlyStopper(cfg(patience=2), path)
    s1.update(1, val(0.5))
    s1.update(2, val(0.5))  # one validation without progress
    for _restart in range(3):
        again = EarlyStopper(cfg(patience=2), path).update(2, val(0.49))
        assert again.bad_evals == 1 and not again.stop and again.score == 0.5
    st = read_state(path)
    assert [e.step for e in st.history] == [1, 2] and st.bad_evals == 1 and not st.stopped
    assert EarlyStopper(cfg(patience=2), path).has_evaluation(2)


def test_state_files_without_patience_ref_still_load(tmp_path: Path) -> None:
    path = tmp_path / "es.json"
    path.write_text(json.dumps({"best_step": 3, "best_score": 0.4, "bad_evals": 1, "history": []}))
    s = EarlyStopper(cfg(patience=3), path)
    assert s.state.patience_ref == 0.4
    assert not s.update(4, val(0.405)).improved and s.state.best_step == 4


def test_improvement_resets_patience() -> None:
    stopper = EarlyStopper(cfg(patience=2))
    seq = [0.1, 0.1, 0.2, 0.2, 0.2]
    stops = [stopper.update(i, val(a)).stop for i, a in enumerate(seq)]
    assert stops == [False, False, False, False, True]


def test_min_delta_and_mode_min() -> None:
    s = EarlyStopper(cfg(patience=1, min_delta=0.05, mode="min"))
    assert s.update(1, val(0.5)).improved
    assert not s.update(2, val(0.47)).improved  # 0.03 < min_delta
    assert s.state.stopped


def test_disabled_never_stops() -> None:
    s = EarlyStopper(cfg(enabled=False, patience=1))
    assert not any(s.update(i, val(0.1)).stop for i in range(5))
    assert s.state.best_step == 0 and s.state.bad_evals == 4


def test_state_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "es.json"
    s1 = EarlyStopper(cfg(patience=2), path)
    s1.update(1, val(0.5))
    s1.update(2, val(0.5))
    s2 = EarlyStopper(cfg(patience=2), path)
    assert s2.update(3, val(0.5)).stop
    assert json.loads(path.read_text())["config"]["patience"] == 2


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"data_source": "t", "metrics": {}}, "early_stopping.metrics"),
        ({"data_source": "t", "metrics": {"a": 1}, "patience": 0}, "early_stopping.patience"),
        ({"metrics": {"a": 1}}, "early_stopping.data_source"),
        ({"data_source": "t", "metrics": {"a": 1}, "mode": "up"}, "early_stopping.mode"),
        ({"data_source": "t", "metrics": {"a": 1}, "typo": 1}, "early_stopping.typo"),
    ],
)
def test_bad_config_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EarlyStoppingConfig.from_mapping(raw)


def test_nan_score_is_an_error() -> None:
    with pytest.raises(ValueError, match="NaN"):
        EarlyStopper(cfg()).update(1, val(float("nan")))


def test_prune_keeps_only_requested(tmp_path: Path) -> None:
    for s in (1, 2, 3, 4):
        (tmp_path / f"global_step_{s}" / "actor").mkdir(parents=True)
    (tmp_path / "early_stopping.json").write_text("{}")
    assert prune_checkpoints(tmp_path, {2, 4}) == [1, 3]
    assert checkpoint_steps(tmp_path) == [2, 4]
    assert (tmp_path / "early_stopping.json").is_file()


def test_per_source_metrics_are_macro_averaged() -> None:
    """data_source "table:<source>" (trainer.registry.data_source): the score is the mean over sources, whatever
    their sizes, and an untagged "table" metric still reads as before."""
    from trainer.phase_rules.early_stopping import per_source_values

    m = {
        "val-aux/table:e2e/table_score/mean@1": 0.9,
        "val-aux/table:rotowire_sent/table_score/mean@1": 0.8,
        "val-aux/table:wikitabletext/table_score/mean@1": 0.4,
        "val-aux/table:wikitabletext/table_score/mean@4": 0.5,
        "val-aux/tablet/table_score/mean@1": 0.0,  # another data source whose name starts alike
        "val-aux/schema:e2e/table_score/mean@1": 0.0,
    }
    assert per_source_values(m, "table", "table_score") == {
        "table:e2e": 0.9, "table:rotowire_sent": 0.8, "table:wikitabletext": 0.5,
    }  # fmt: skip
    assert metric_value(m, "table", "table_score") == pytest.approx((0.9 + 0.8 + 0.5) / 3)
    c = EarlyStoppingConfig.from_mapping({"data_source": "table", "metrics": {"table_score": 1.0}})
    assert phase_score(c, m) == pytest.approx(0.7333333)

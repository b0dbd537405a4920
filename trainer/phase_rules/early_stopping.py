"""Early stopping for the RL phases (VERL has none): the pure decision logic and its state file.

Policy, stated once: after every validation the phase's score is the weighted mean of its
validation metrics (``val-core|val-aux/<data_source>/<key>/mean@N``, largest N). When the data carries
its golden source (``table:e2e``, ``table:wikitabletext``: :mod:`trainer.registry.data_source`), each metric is the
macro mean over sources, so the largest source cannot hide the one where the model is weak. Two
questions, kept apart:

- *Which checkpoint is best?* The highest-scoring validated step (``mode`` direction; an earlier
  step wins a tie). ``min_delta`` plays no part: a step that beats the best by less than
  ``min_delta`` is still the better checkpoint, so it is kept and exported, never pruned.
- *Is training still improving?* A score counts as progress when it beats the score of the last
  progress (``patience_ref``) by more than ``min_delta``. After ``patience`` validations in a row
  without progress, the run stops.

Step 0 (``val_before_train``) is the starting policy: if nothing beats it, the best "checkpoint" is
the input model itself (``best_step == 0``). Each step is scored once: a resumed run that validates
a step the state already holds (VERL re-validates the resumed step) changes nothing and spends no
patience.

The state is a JSON file written after every validation, so a resumed run continues the count and
the loop knows which checkpoint to export. :mod:`trainer.in_verl.phase_trainer` hooks it into VERL.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainer.registry.data_source import belongs_to

STATE_FILE = "early_stopping.json"
_METRIC_RE = re.compile(r"^val-(?:core|aux)/(?P<ds>[^/]+)/(?P<key>[^/]+)/mean@(?P<n>\d+)$")


class EarlyStoppingConfig(BaseModel):
    """The ``early_stopping`` block of a phase config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Off: validate and record, never stop.")
    data_source: str = Field(
        description="Reward kind whose validation metrics are read (schema/table/pipeline); its per-source "
        "tags kind:source are macro-averaged."
    )
    metrics: dict[str, float] = Field(description="Metric key → weight; the score is the weighted mean.")
    patience: int = Field(3, ge=1, description="Validations without improvement before stopping.")
    min_delta: float = Field(0.005, ge=0, description="Smallest gain that counts as an improvement.")
    mode: Literal["max", "min"] = Field("max", description="max: higher is better.")

    @field_validator("metrics")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("early_stopping.metrics: at least one metric is needed")
        if any(w < 0 for w in v.values()) or sum(v.values()) <= 0:
            raise ValueError(f"early_stopping.metrics: weights must be >= 0 with a positive sum, got {v}")
        return v

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> EarlyStoppingConfig:
        """Validate a (Hydra) mapping; errors name the ``early_stopping.<field>``."""
        try:
            return cls.model_validate(dict(raw))
        except ValidationError as exc:
            msgs = [f"early_stopping.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise ValueError("; ".join(msgs)) from None


def per_source_values(val_metrics: Mapping[str, Any], data_source: str, key: str) -> dict[str, float]:
    """``val-*/<ds>/<key>/mean@N`` (largest N) for ``data_source`` and each of its per-source tags
    (``<data_source>:<source>``), keyed by the logged data_source."""
    best: dict[str, tuple[int, float]] = {}
    for name, v in val_metrics.items():
        m = _METRIC_RE.match(name)
        if m and belongs_to(m["ds"], data_source) and m["key"] == key:
            n = int(m["n"])
            if n > best.get(m["ds"], (-1, 0.0))[0]:
                best[m["ds"]] = (n, float(v))
    return {ds: value for ds, (_, value) in sorted(best.items())}


def metric_value(val_metrics: Mapping[str, Any], data_source: str, key: str) -> float:
    """``val-*/<data_source>/<key>/mean@N`` with the largest N, or the macro mean over its per-source tags;
    KeyError lists what exists."""
    values = per_source_values(val_metrics, data_source, key)
    if not values:
        have = sorted(n for n in val_metrics if n.startswith("val-"))
        raise KeyError(f"no validation metric val-*/{data_source}/{key}/mean@N; have {have}")
    return sum(values.values()) / len(values)


def phase_score(cfg: EarlyStoppingConfig, val_metrics: Mapping[str, Any]) -> float:
    """Weighted mean of the configured metrics."""
    total = sum(cfg.metrics.values())
    return sum(w * metric_value(val_metrics, cfg.data_source, k) for k, w in cfg.metrics.items()) / total


@dataclass
class Evaluation:
    step: int
    score: float
    improved: bool


@dataclass
class StopState:
    """Everything the decision needs across restarts (the JSON state file)."""

    best_step: int | None = None
    best_score: float | None = None
    patience_ref: float | None = None
    bad_evals: int = 0
    stopped: bool = False
    stop_step: int | None = None
    history: list[Evaluation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StopState:
        hist = [Evaluation(**h) for h in raw.get("history", [])]
        return cls(
            best_step=raw.get("best_step"),
            best_score=raw.get("best_score"),
            # state files written before patience_ref existed compared patience against best_score
            patience_ref=raw.get("patience_ref", raw.get("best_score")),
            bad_evals=int(raw.get("bad_evals", 0)),
            stopped=bool(raw.get("stopped", False)),
            stop_step=raw.get("stop_step"),
            history=hist,
        )


@dataclass(frozen=True)
class Decision:
    step: int
    score: float
    improved: bool
    best_step: int
    best_score: float
    bad_evals: int
    stop: bool

    def as_metrics(self) -> dict[str, float]:
        """Logged beside VERL's metrics, so the curve and the decision sit together."""
        return {
            "early_stopping/score": self.score,
            "early_stopping/best_score": self.best_score,
            "early_stopping/best_step": float(self.best_step),
            "early_stopping/bad_evals": float(self.bad_evals),
            "early_stopping/stop": float(self.stop),
        }


class EarlyStopper:
    """Feeds validation results in; says when to stop and which step was best."""

    def __init__(self, cfg: EarlyStoppingConfig, state_path: Path | None = None) -> None:
        self.cfg = cfg
        self.state_path = state_path
        self.state = StopState()
        if state_path is not None and state_path.is_file():
            self.state = StopState.from_json(json.loads(state_path.read_text()))

    def _gain(self, score: float, reference: float) -> float:
        return score - reference if self.cfg.mode == "max" else reference - score

    def has_evaluation(self, step: int) -> bool:
        """The state already holds a validation of ``step`` (a resumed run need not repeat it)."""
        return any(e.step == step for e in self.state.history)

    def update(self, step: int, val_metrics: Mapping[str, Any]) -> Decision:
        """Record one validation; returns the decision (``stop`` only when enabled).

        A step already recorded (a resumed run re-validating its checkpoint) keeps its first score
        and spends no patience.
        """
        st = self.state
        if self.has_evaluation(step):
            first = next(e for e in st.history if e.step == step)
            return self._decision(step, first.score, first.improved)
        score = phase_score(self.cfg, val_metrics)
        if math.isnan(score):
            raise ValueError(f"early stopping: validation score at step {step} is NaN ({self.cfg.metrics})")
        if st.best_score is None or self._gain(score, st.best_score) > 0:
            st.best_step, st.best_score = step, score
        improved = st.patience_ref is None or self._gain(score, st.patience_ref) > self.cfg.min_delta
        if improved:
            st.patience_ref, st.bad_evals = score, 0
        else:
            st.bad_evals += 1
        st.history.append(Evaluation(step=step, score=score, improved=improved))
        if self.cfg.enabled and st.bad_evals >= self.cfg.patience and not st.stopped:
            st.stopped, st.stop_step = True, step
        self.save()
        return self._decision(step, score, improved)

    def _decision(self, step: int, score: float, improved: bool) -> Decision:
        st = self.state
        assert st.best_step is not None and st.best_score is not None
        stop = self.cfg.enabled and st.bad_evals >= self.cfg.patience
        return Decision(step, score, improved, st.best_step, st.best_score, st.bad_evals, stop)

    def save(self) -> None:
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        payload = {"config": self.cfg.model_dump(), **self.state.to_json()}
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        tmp.replace(self.state_path)


def read_state(path: Path) -> StopState:
    """The state file of a finished or running phase."""
    return StopState.from_json(json.loads(path.read_text()))


def checkpoint_steps(ckpt_dir: Path) -> list[int]:
    """Steps with a ``global_step_N`` directory under ``ckpt_dir``, ascending."""
    if not ckpt_dir.is_dir():
        return []
    steps = []
    for p in ckpt_dir.iterdir():
        m = re.fullmatch(r"global_step_(\d+)", p.name)
        if m and p.is_dir():
            steps.append(int(m[1]))
    return sorted(steps)


def prune_checkpoints(ckpt_dir: Path, keep: set[int]) -> list[int]:
    """Delete ``global_step_N`` directories whose N is not in ``keep``; returns the deleted steps."""
    removed = [s for s in checkpoint_steps(ckpt_dir) if s not in keep]
    for s in removed:
        shutil.rmtree(ckpt_dir / f"global_step_{s}")
    return removed

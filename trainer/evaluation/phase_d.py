"""Phase-D evaluation: run or score the two-stage pipeline per named setting, report side by side.

Every number comes from ``shared`` (schema P/R/F1, cell accuracy, aligned metrics); this module only
runs models, averages and renders. Data source of an example = its id before the first ``-``.
Invalid outputs count as zero in every quality metric (and lower the valid rates), so a setting
cannot gain by emitting nothing. Each setting's serving mode (the executors' build, eager, prefix caching,
batch-invariant mode; the client's concurrency and max tokens) is recorded beside its scores: what a rerun
must match to give the same answers (docs/reliability.md#evaluations-that-repeat).

Answers cut at the token limit and prompts the executor refused (HTTP 400) are counted per setting and stage,
named, and limited to a share of the answers: the outputs are written, then the evaluation fails past it. Final
files are written whole (a temporary file renamed over them); the answers themselves are kept as they come in each
setting's answer log (:mod:`trainer.evaluation.answer_log`), which a rerun under the same key continues from.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import (
    PROMPT_VERSION,
    AlignedMetrics,
    GoldenExample,
    compute_schema_reward_single,
    compute_table_reward_single,
)
from shared.golden import source_of
from trainer.evaluation.answer_log import AnswerLog, write_atomic
from trainer.evaluation.generation import GenerationConfig, check_refused, check_truncated
from trainer.evaluation.inference import read_jsonl, write_jsonl
from trainer.evaluation.report import SCHEMA_METRICS, TABLE_METRICS, aligned_key, markdown_report, plot_metrics
from trainer.evaluation.significance import intervals, paired_tests
from trainer.evaluation.two_stage import PromptStage, run_two_stage
from trainer.serving.endpoint import UNKNOWN, Endpoint, ServingMode

# End-to-end, order-invariant aligned cell F1 (names normalised): the default table reward's number, so
# training and report agree; the loop-2 rule and the paired tests read its macro mean over sources.
DEFAULT_DECISION_METRIC = "aligned_cell_f1"
DEFAULT_PAIRED_METRIC = "aligned_cell_f1"
# Past this share of a stage's answers cut at max_tokens, an evaluation fails (the scores would count them wrong).
DEFAULT_MAX_TRUNCATED_SHARE = 0.02
# Past this share of a stage's prompts refused by the executor (HTTP 400), likewise.
DEFAULT_MAX_REFUSED_SHARE = 0.02


@dataclass(frozen=True)
class Setting:
    """A named π1/π2 pair: ``NAME=π1URL,π1MODEL,π2URL,π2MODEL``."""

    name: str
    schema_url: str
    schema_model: str
    table_url: str
    table_model: str

    @classmethod
    def parse(cls, spec: str) -> Setting:
        name, sep, rest = spec.partition("=")
        parts = rest.split(",")
        if not sep or not name or len(parts) != 4 or not all(parts):
            raise ValueError(f"--setting {spec!r}: expected NAME=π1URL,π1MODEL,π2URL,π2MODEL")
        return cls(name, *parts)

    def endpoint(self, model: str, stage: PromptStage) -> AbstractContextManager[Endpoint]:
        """The runner's "URL for this model": the setting's own, by stage (π1 and π2 may share a name)."""
        url = self.schema_url if stage == "stage1" else self.table_url
        return nullcontext(Endpoint(url, model))


def parse_named_path(spec: str) -> tuple[str, Path]:
    """``NAME=FILE`` for ``evaluate score --predictions``."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--predictions {spec!r}: expected NAME=FILE")
    return name, Path(path)


# ---- scoring ----------------------------------------------------------------------------------


def score_example(ex: GoldenExample, pred: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics of one example. ``schema_prediction`` / ``table_prediction`` may be absent (not
    evaluated) or, for the table, ``None`` (the pipeline stopped at an invalid schema: scored 0)."""
    row: dict[str, Any] = {"id": ex.id, "source": source_of(ex.id)}
    if "schema_prediction" in pred:
        s = compute_schema_reward_single(str(pred["schema_prediction"]), ex.schema_dict())
        row.update(
            schema_valid=float(s.valid_json), schema_precision=s.precision, schema_recall=s.recall, schema_f1=s.f1
        )
    for stage in ("schema", "table"):  # cut at the token limit, refused (records of a run that read them)
        for flag in ("truncated", "refused"):
            if pred.get(f"{stage}_{flag}") is not None:
                row[f"{stage}_{flag}"] = bool(pred[f"{stage}_{flag}"])
    if "table_prediction" in pred:
        text = pred["table_prediction"]
        t = compute_table_reward_single(text, ex.table_dict()) if text is not None else None
        row["table_valid"] = float(bool(t and t.valid_json))
        row["cell_accuracy"] = t.cell_accuracy if t else 0.0
        aligned = t.aligned.as_dict() if t and t.aligned else dict.fromkeys(AlignedMetrics.__dataclass_fields__, 0.0)
        row.update({aligned_key(k): v for k, v in aligned.items()})
    return row


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means of every metric present: pooled over documents (``overall``), per data source, and the
    ``macro`` mean over sources (each source weighs the same: the headline, since a pooled number is
    dominated by the largest source and hides the one where a model is weak)."""

    def means(group: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
        out: dict[str, float | int] = {"n": len(group)}
        for key in (*SCHEMA_METRICS, *TABLE_METRICS):
            vals = [float(r[key]) for r in group if key in r]
            if vals:
                out[key] = statistics.fmean(vals)
        return out

    sources = sorted({str(r["source"]) for r in rows})
    per_source = {s: means([r for r in rows if r["source"] == s]) for s in sources}
    return {"overall": means(rows), "per_source": per_source, "macro": macro_means(per_source)}


def macro_means(per_source: Mapping[str, Mapping[str, float | int]]) -> dict[str, float | int]:
    """Unweighted mean over sources of every metric that every source has; ``n`` is the number of sources."""
    out: dict[str, float | int] = {"n": len(per_source)}
    if not per_source:
        return out
    keys = set.intersection(*(set(m) for m in per_source.values())) - {"n"}
    for key in (*SCHEMA_METRICS, *TABLE_METRICS):
        if key in keys:
            out[key] = statistics.fmean(float(m[key]) for m in per_source.values())
    return out


def score_predictions(golden: Sequence[GoldenExample], preds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Score prediction records against golden examples by id; a missing or unknown id is an error."""
    by_id = {ex.id: ex for ex in golden}
    unknown = [p.get("id") for p in preds if p.get("id") not in by_id]
    if unknown:
        raise ValueError(f"predictions: ids not in the golden file: {unknown[:5]}")
    return [score_example(by_id[str(p["id"])], p) for p in preds]


def normalize_prediction_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Accept pipeline records (schema_/table_prediction) and ``trainer infer`` records (stage + prediction)."""
    if "id" not in rec:
        raise ValueError("prediction record lacks field 'id'")
    if "schema_prediction" in rec or "table_prediction" in rec:
        return dict(rec)
    stage = rec.get("stage")
    if stage not in ("stage1", "stage2") or "prediction" not in rec:
        raise ValueError(
            f"prediction {rec['id']!r}: need 'schema_prediction'/'table_prediction' or 'stage'+'prediction'"
        )
    key = "schema" if stage == "stage1" else "table"
    out = {"id": rec["id"], f"{key}_prediction": rec["prediction"]}
    if rec.get("truncated") is not None:
        out[f"{key}_truncated"] = bool(rec["truncated"])
    return out


# ---- running ----------------------------------------------------------------------------------


def run_pipeline(
    setting: Setting, examples: Sequence[GoldenExample], gen: GenerationConfig, log: AnswerLog | None = None
) -> list[dict[str, Any]]:
    """Stage 1 with π1, then Stage 2 with π2 on each *predicted* schema, both at the setting's URLs; ``log``: the
    setting's answers kept so far (only the others are asked), and where each new one is kept."""
    return run_two_stage(
        setting.name, setting.schema_model, setting.table_model, examples, setting.endpoint, gen, log=log
    )


def answer_log_path(out: Path, name: str) -> Path:
    """Where ``evaluate pipeline`` keeps setting ``name``'s answers as they come (its key beside it)."""
    return out / f"predictions_{name}.partial.jsonl"


def pipeline_key(setting: Setting, gen: GenerationConfig, serving: ServingMode | None = None) -> dict[str, Any]:
    """What a setting's answers depend on besides their prompts: the setting, its models (name and URL), the
    generation settings (max tokens, temperature, seed, concurrency, timeout, attempts), the prompts' version and
    how the executors serve (unknown for servers started elsewhere)."""
    import dataclasses

    return {
        "setting": setting.name,
        "schema_model": {"model": setting.schema_model, "url": setting.schema_url},
        "table_model": {"model": setting.table_model, "url": setting.table_url},
        "generation": dataclasses.asdict(gen),
        "prompt_version": PROMPT_VERSION,
        "serving": (serving or ServingMode()).as_dict(),
    }


# ---- decision and report ----------------------------------------------------------------------


def loop2_decision(
    metrics: Mapping[str, Mapping[str, Any]],
    metric: str = DEFAULT_DECISION_METRIC,
    min_gain_points: float = 1.0,
    compare: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The loop's second-round rule (``trainer loop --loops 2``, docs/training.md): stop when ``last`` gains
    < ``min_gain_points`` (×100) over ``previous``, on the macro mean over sources (the pooled mean where a
    setting has no ``macro``).

    ``compare`` = (previous, last); default: the last two settings.
    """
    names = list(metrics)
    if compare is None and len(names) < 2:
        return {"decision": "n/a", "reason": "needs at least two settings", "metric": metric}
    prev, last = compare or (names[-2], names[-1])
    if prev not in metrics or last not in metrics:
        raise ValueError(f"loop-2 comparison {prev!r} vs {last!r}: settings are {names}")
    a = metrics[prev].get("macro", metrics[prev]["overall"]).get(metric)
    b = metrics[last].get("macro", metrics[last]["overall"]).get(metric)
    if a is None or b is None:
        return {"decision": "n/a", "reason": f"metric {metric!r} missing", "metric": metric}
    gain = 100.0 * (float(b) - float(a))
    stop = gain < min_gain_points
    return {
        "decision": "stop" if stop else "continue",
        "metric": metric,
        "previous": prev,
        "last": last,
        "mean": "macro over sources" if "macro" in metrics[last] else "pooled",
        "gain_points": round(gain, 3),
        "min_gain_points": min_gain_points,
        "reason": f"{last} vs {prev}: {gain:+.2f} points {'<' if stop else '>='} {min_gain_points}",
    }


@dataclass
class EvalOutputs:
    metrics: dict[str, Any]
    decision: dict[str, Any]
    report: Path
    metrics_path: Path
    plots: list[Path]
    predictions: dict[str, Path]


SFT_BASELINE = "sft"


def comparison_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Each setting against the one before it (base → sft → local → pipe), and every setting after ``sft``
    against ``sft`` too (sft → pipe): "no source worse than sft" is a paired test for each RL setting, not
    only for the first."""
    pairs = list(itertools.pairwise(names))
    if SFT_BASELINE in names:
        after = names[names.index(SFT_BASELINE) + 1 :]
        pairs += [(SFT_BASELINE, n) for n in after if (SFT_BASELINE, n) not in pairs]
    return pairs


def _flagged(rows: Sequence[Mapping[str, Any]], flag: str, count: str) -> dict[str, dict[str, Any]]:
    """Per stage: the answers with ``flag``, of those where it is known, as ``count``, their share and ids."""
    out: dict[str, dict[str, Any]] = {}
    for stage in ("schema", "table"):
        known = [r for r in rows if f"{stage}_{flag}" in r]
        if known:
            hit = [str(r["id"]) for r in known if r[f"{stage}_{flag}"]]
            out[stage] = {count: len(hit), "answers": len(known), "share": len(hit) / len(known), "ids": hit[:20]}
    return out


def truncation(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage: answers cut at the token limit, of the answers whose finish reason is known, and their ids."""
    return _flagged(rows, "truncated", "cut")


def refusals(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage: prompts the executor refused (HTTP 400), of the prompts of a run that recorded it, and their ids."""
    return _flagged(rows, "refused", "refused")


def serving_record(
    names: Sequence[str],
    modes: Mapping[str, ServingMode | None] | None,
    concurrency: int | None,
    max_tokens: int | None,
) -> dict[str, dict[str, Any]]:
    """Per setting, how its answers were generated: its executors' mode and the client's concurrency and
    max tokens, ``"unknown"`` for what the caller does not know (a server it did not start, offline scoring)."""
    known = modes or {}
    return {
        name: {
            **(known.get(name) or ServingMode()).as_dict(),
            "concurrency": UNKNOWN if concurrency is None else concurrency,
            "max_tokens": UNKNOWN if max_tokens is None else max_tokens,
        }
        for name in names
    }


def write_outputs(
    out: Path,
    golden: Sequence[GoldenExample],
    predictions: Mapping[str, Sequence[Mapping[str, Any]]],
    title: str,
    decision_metric: str = DEFAULT_DECISION_METRIC,
    min_gain_points: float = 1.0,
    write_predictions: bool = True,
    compare: tuple[str, str] | None = None,
    paired_metric: str = DEFAULT_PAIRED_METRIC,
    max_tokens: int | None = None,
    max_truncated_share: float = DEFAULT_MAX_TRUNCATED_SHARE,
    serving: Mapping[str, ServingMode | None] | None = None,
    concurrency: int | None = None,
    max_refused_share: float = DEFAULT_MAX_REFUSED_SHARE,
) -> EvalOutputs:
    """Score every setting's predictions; write metrics.json, report.md, plots/ (and predictions).

    Every setting gets 95% bootstrap intervals (``ci95``: pooled, per source and macro); the settings are
    paired-tested as :func:`comparison_pairs` lists them on ``paired_metric``, macro, pooled and per
    source; on ``schema_f1`` where no setting holds a table (Stage-1 predictions only).

    Answers cut at the token limit (``max_tokens``, recorded) are counted per setting and stage
    (``truncated``); past ``max_truncated_share`` of a stage's answers, the outputs are written and then
    :class:`~trainer.evaluation.generation.TruncatedAnswersError` names the setting, the stage and the count.
    Prompts the executor refused (HTTP 400; scored as wrong) likewise: ``refused``, ``max_refused_share``,
    :class:`~trainer.evaluation.generation.RefusedAnswersError`, which also names the documents.
    Every file is written whole or not at all.

    ``serving`` (each setting's executors' mode, as far as the caller knows it) and ``concurrency`` are
    recorded per setting (metrics.json ``serving``, one line of report.md), with ``max_tokens``.
    """
    if not golden:
        # a report over n = 0 would read as a finished evaluation with no numbers in it
        raise ValueError(f"{title}: no golden examples to evaluate (an empty split, or --limit 0)")
    out.mkdir(parents=True, exist_ok=True)
    scored, metrics, pred_paths = _score_each_setting(out, golden, predictions, write_predictions)
    decision = loop2_decision(metrics, decision_metric, min_gain_points, compare)
    names = list(predictions)
    if not any(paired_metric in r for rows in scored.values() for r in rows):
        # Stage-1 predictions only (`trainer infer stage1`): no table was written, so the settings are
        # compared on what they hold, the schema
        paired_metric = "schema_f1"
    tests = paired_tests(scored, comparison_pairs(names), paired_metric)
    served = serving_record(names, serving, concurrency, max_tokens)
    metrics_path = out / "metrics.json"
    _write_metrics(metrics_path, metrics, decision, tests, served, max_tokens, max_truncated_share, max_refused_share)
    report = out / "report.md"
    write_atomic(report, markdown_report(metrics, decision, title, tests, max_tokens, served))
    plots = plot_metrics(metrics, out / "plots")
    _check_shares(metrics, title, max_tokens, max_truncated_share, max_refused_share)
    return EvalOutputs(metrics, decision, report, metrics_path, plots, pred_paths)


def _score_each_setting(
    out: Path,
    golden: Sequence[GoldenExample],
    predictions: Mapping[str, Sequence[Mapping[str, Any]]],
    write_predictions: bool,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], dict[str, Path]]:
    """Per setting: its scored rows, its metrics (with intervals, cut and refused answers) and, when written, its
    predictions file (each prediction with its scores)."""
    metrics: dict[str, Any] = {}
    pred_paths: dict[str, Path] = {}
    scored: dict[str, list[dict[str, Any]]] = {}
    for name, preds in predictions.items():
        rows = scored[name] = score_predictions(golden, preds)
        metrics[name] = aggregate(rows)
        metrics[name]["ci95"] = intervals(rows, (*SCHEMA_METRICS, *TABLE_METRICS))
        metrics[name]["truncated"] = truncation(rows)
        metrics[name]["refused"] = refusals(rows)
        if write_predictions:
            pred_paths[name] = out / f"predictions_{name}.jsonl"
            write_jsonl(pred_paths[name], [{**p, **r} for p, r in zip(preds, rows, strict=True)])
    return scored, metrics, pred_paths


def _write_metrics(
    path: Path,
    metrics: Mapping[str, Any],
    decision: Mapping[str, Any],
    tests: Sequence[Mapping[str, Any]],
    served: Mapping[str, Any],
    max_tokens: int | None,
    max_truncated_share: float,
    max_refused_share: float,
) -> None:
    """metrics.json: the settings' metrics, the loop-2 decision and the paired tests, with the limits they ran under."""
    write_atomic(
        path,
        json.dumps(
            {
                "prompt_version": PROMPT_VERSION,
                "max_tokens": max_tokens,
                "max_truncated_share": max_truncated_share,
                "max_refused_share": max_refused_share,
                "serving": served,
                "settings": metrics,
                "loop2": decision,
                "paired_tests": tests,
            },
            indent=2,
        )
        + "\n",
    )


def _check_shares(
    metrics: Mapping[str, Any],
    title: str,
    max_tokens: int | None,
    max_truncated_share: float,
    max_refused_share: float,
) -> None:
    """Raise past a setting's share of refused prompts, then past its share of answers cut at the token limit."""
    for name in metrics:
        for stage, r in metrics[name]["refused"].items():
            what = f"{title}: setting {name!r}, {'π1 schemas' if stage == 'schema' else 'π2 tables'}"
            check_refused(what, r["refused"], r["answers"], r["ids"], max_refused_share)
    for name in metrics:
        for stage, t in metrics[name]["truncated"].items():
            what = f"{title}: setting {name!r}, {'π1 schemas' if stage == 'schema' else 'π2 tables'}"
            check_truncated(what, t["cut"], t["answers"], max_tokens, max_truncated_share)


def load_predictions(path: Path) -> list[dict[str, Any]]:
    return [normalize_prediction_record(r) for r in read_jsonl(path)]

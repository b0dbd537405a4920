"""Reward audit: edits that must not raise a reward, and edits that must not lower it.

For real golden examples of every source, a prediction is built from the gold table, *perfect* (the gold
itself) or *damaged* (about a third of its non-empty cells replaced by a wrong value, the rest kept and
remembered as correct). Each edit below is applied to it, the rewards of the prediction before and after
are computed in-process with ``shared``, and a move the wrong way is counted:

- **worsening** edits must not raise a reward: pad with null columns, pad with invented non-null
  columns, drop a correct column, rename a correct column to another name, duplicate a row, shuffle rows
  (against the positional pairing), empty a correct cell, wrap a correct value in quotes, change the
  number formatting of a correct numeric value.
- **equivalent** edits must not lower a reward: reorder rows, reorder columns, change the formatting of
  every column name (``number_of_deaths`` → ``Number Of Deaths``), write numeric and boolean cells as
  JSON numbers and booleans.

Rewards: schema (the prediction's keys as the schema), table with ``table_metric`` positional and
aligned (the default), and the pipeline reward with each, with an oracle executor (the table *is* the
executor's answer, so the pipeline reward is ``a·schema + (1 − a)·table``).

``python -m bench reward-audit [--quick] [--per-source N]`` writes ``bench/results/reward_audit.{json,md}``.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import golden_dir, header_md, md_table, run_record, write_result
from shared import (
    DEFAULT_MAX_ALIGN_ROWS,
    GoldenExample,
    PipelineSchemaRewardConfig,
    SchemaReward,
    TableRewardConfig,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    normalize_cell,
    normalize_name,
    read_split,
)
from shared.golden import source_of

Row = dict[str, Any]
WRONG_VALUE = "unknown value"
DAMAGE_SHARE = 0.34
EPS = 1e-9

REWARDS = ("schema", "table_positional", "table_aligned", "pipeline_positional", "pipeline_aligned")
DEFAULT_REWARDS = ("schema", "table_aligned", "pipeline_aligned")


@dataclass
class Prediction:
    """A predicted table as rows, with the cells known to be correct as (row, column) pairs."""

    rows: list[Row]
    correct: set[tuple[int, str]]
    numbers: bool = False  # write numeric/boolean strings as JSON numbers/booleans

    def copy(self) -> Prediction:
        return Prediction([dict(r) for r in self.rows], set(self.correct), self.numbers)

    def ndjson(self) -> str:
        return "\n".join(_line(r, self.numbers) for r in self.rows)

    def columns(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.rows:
            seen.update(dict.fromkeys(r))
        return list(seen)

    def correct_columns(self) -> list[str]:
        """Columns with at least one non-empty cell, all of whose non-empty cells are correct."""
        out = []
        for k in self.columns():
            filled = [i for i, r in enumerate(self.rows) if r.get(k) not in (None, "")]
            if filled and all((i, k) in self.correct for i in filled):
                out.append(k)
        return out


_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _as_json(value: Any) -> str | None:
    """The bare JSON literal whose text is the cell (``"1.50"`` → ``1.50``, ``"true"`` → ``true``), or None."""
    if isinstance(value, str) and (_NUMBER.match(value) or value in ("true", "false")):
        return value
    return None


def _line(row: Row, literals: bool) -> str:
    """One NDJSON line; with ``literals``, numeric and boolean strings are written bare, digit for digit
    (``json.dumps`` of a float would write ``1.5`` for ``1.50``)."""
    if not literals:
        return json.dumps(row)
    parts = []
    for k, v in row.items():
        lit = _as_json(v)
        parts.append(f"{json.dumps(k)}: {lit if lit is not None else json.dumps(v)}")
    return "{" + ", ".join(parts) + "}"


# ---- bases -------------------------------------------------------------------------------------


def gold_rows(ex: GoldenExample) -> list[Row]:
    t = ex.table_dict()
    names = [c["name"] for c in t["columns"]]
    return [dict(zip(names, row, strict=True)) for row in t["data"]]


def perfect(ex: GoldenExample) -> Prediction:
    rows = gold_rows(ex)
    return Prediction(rows, {(i, k) for i, r in enumerate(rows) for k, v in r.items() if v not in (None, "")})


def damaged(ex: GoldenExample, rng: random.Random) -> Prediction | None:
    """About a third of the non-empty cells wrong; ``None`` when fewer than two non-empty cells exist."""
    p = perfect(ex)
    cells = sorted(p.correct)
    if len(cells) < 2:
        return None
    k = max(1, min(len(cells) - 1, round(DAMAGE_SHARE * len(cells))))
    for i, key in rng.sample(cells, k):
        p.rows[i][key] = WRONG_VALUE
        p.correct.discard((i, key))
    return p


# ---- edits -------------------------------------------------------------------------------------

Edit = Callable[[Prediction, "Context", random.Random], Prediction | None]


@dataclass(frozen=True)
class Context:
    gold_names: frozenset[str]  # normalised
    junk_names: Sequence[str]  # column names of other examples of the same source
    junk_values: Sequence[str]
    gold_rows: Sequence[Row] = ()


def _content(row: Row) -> frozenset[tuple[str, str]]:
    return frozenset((normalize_name(k), normalize_cell(v)) for k, v in row.items() if normalize_cell(v))


def _junk(ctx: Context, pred: Prediction, rng: random.Random, k: int) -> list[str]:
    taken = ctx.gold_names | {normalize_name(n) for n in pred.columns()}
    pool = [n for n in ctx.junk_names if normalize_name(n) not in taken and normalize_name(n)]
    out: list[str] = []
    for n in rng.sample(pool, min(len(pool), 4 * k)):
        if normalize_name(n) not in {normalize_name(x) for x in out}:
            out.append(n)
        if len(out) == k:
            break
    return out


def pad_null_columns(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    names = _junk(ctx, pred, rng, rng.randint(1, 3))
    out = pred.copy()
    for r in out.rows:
        r.update(dict.fromkeys(names))
    return out if names else None


def pad_invented_columns(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    names = _junk(ctx, pred, rng, rng.randint(1, 3))
    out = pred.copy()
    for r in out.rows:
        r.update({n: rng.choice(ctx.junk_values) for n in names})
    return out if names and out.rows else None


def drop_correct_column(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    cols = pred.correct_columns()
    if not cols:
        return None
    key = rng.choice(cols)
    out = pred.copy()
    for r in out.rows:
        r.pop(key, None)
    out.correct = {c for c in out.correct if c[1] != key}
    return out


def rename_correct_column(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    cols, junk = pred.correct_columns(), _junk(ctx, pred, rng, 1)
    if not cols or not junk:
        return None
    key = rng.choice(cols)
    out = pred.copy()
    out.rows = [{(junk[0] if k == key else k): v for k, v in r.items()} for r in out.rows]
    out.correct = {c for c in out.correct if c[1] != key}
    return out


def duplicate_row(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    """An extra copy of a row with correct cells, beyond the copies the gold table has of it (a copy that
    the gold table warrants, as when it repeats a row, is no worsening edit)."""
    gold = [_content(g) for g in ctx.gold_rows]
    pred_content = [_content(r) for r in pred.rows]
    extra = [
        i for i in sorted({i for i, _ in pred.correct})
        if pred_content.count(pred_content[i]) >= gold.count(pred_content[i])
    ]  # fmt: skip
    if not extra:
        return None
    out = pred.copy()
    out.rows.append(dict(out.rows[rng.choice(extra)]))
    return out


def shuffle_rows(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    if len(pred.rows) < 2:
        return None
    order = list(range(len(pred.rows)))
    while order == sorted(order):
        rng.shuffle(order)
    out = pred.copy()
    out.rows = [pred.rows[i] for i in order]
    out.correct = {(order.index(i), k) for i, k in pred.correct}
    return out


def _one_correct_cell(
    pred: Prediction, rng: random.Random, change: Callable[[str], Any], only: Callable[[str], bool] = bool
) -> Prediction | None:
    cells = [(i, k) for i, k in sorted(pred.correct) if only(str(pred.rows[i][k]))]
    if not cells:
        return None
    i, k = rng.choice(cells)
    out = pred.copy()
    out.rows[i][k] = change(str(out.rows[i][k]))
    out.correct.discard((i, k))
    return out


def empty_cell(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    return _one_correct_cell(pred, rng, lambda v: None)


def quote_value(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    return _one_correct_cell(pred, rng, lambda v: f'"{v}"')


def number_format(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    def reformat(v: str) -> str:
        return f"{v}0" if "." in v else f"{v}.0"

    return _one_correct_cell(pred, rng, reformat, lambda v: bool(_NUMBER.match(v)))


def reorder_rows(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    return shuffle_rows(pred, ctx, rng)


def reorder_columns(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    if len(pred.columns()) < 2:
        return None
    out = pred.copy()
    for i, r in enumerate(out.rows):
        items = list(r.items())
        rng.shuffle(items)
        out.rows[i] = dict(items)
    return out


def _formatted(name: str, style: int) -> str:
    words = [w for w in name.split("_") if w]
    if style == 0:
        return " ".join(w.capitalize() for w in words)
    if style == 1:
        return words[0] + "".join(w.capitalize() for w in words[1:]) if words else name
    return "-".join(words).upper()


def name_formatting(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    style = rng.randrange(3)
    mapping = {k: _formatted(k, style) for k in pred.columns()}
    if all(v == k for k, v in mapping.items()) or any(
        normalize_name(v) != normalize_name(k) for k, v in mapping.items()
    ):
        return None  # nothing to reformat, or a formatting that normalize_name does not undo (not equivalent)
    out = pred.copy()
    out.rows = [{mapping[k]: v for k, v in r.items()} for r in out.rows]
    out.correct = {(i, mapping[k]) for i, k in out.correct}
    return out


def json_literals(pred: Prediction, ctx: Context, rng: random.Random) -> Prediction | None:
    if not any(_as_json(v) is not None for r in pred.rows for v in r.values()):
        return None
    out = pred.copy()
    out.numbers = True
    return out


WORSENING: dict[str, Edit] = {
    "pad_null_columns": pad_null_columns,
    "pad_invented_columns": pad_invented_columns,
    "drop_correct_column": drop_correct_column,
    "rename_correct_column": rename_correct_column,
    "duplicate_row": duplicate_row,
    "shuffle_rows": shuffle_rows,
    "empty_correct_cell": empty_cell,
    "quote_correct_value": quote_value,
    "number_format": number_format,
}
EQUIVALENT: dict[str, Edit] = {
    "reorder_rows": reorder_rows,
    "reorder_columns": reorder_columns,
    "name_formatting": name_formatting,
    "json_literals": json_literals,
}


# ---- rewards -----------------------------------------------------------------------------------

POSITIONAL = TableRewardConfig(table_metric="positional", aligned_metrics=False)
ALIGNED = TableRewardConfig(aligned_metrics=False)
PIPELINE = PipelineSchemaRewardConfig()


def rewards(pred: Prediction, ex: GoldenExample) -> dict[str, float]:
    """Every audited reward of one prediction (the schema is the prediction's keys)."""
    gold_table, text = ex.table_dict(), pred.ndjson()
    schema: SchemaReward = compute_schema_reward_single(json.dumps(pred.columns()), ex.schema_dict())
    pos = compute_table_reward_single(text, gold_table, POSITIONAL)
    ali = compute_table_reward_single(text, gold_table, ALIGNED)
    return {
        "schema": schema.reward,
        "table_positional": pos.reward,
        "table_aligned": ali.reward,
        "pipeline_positional": combine_pipeline_reward(schema, pos, PIPELINE).reward,
        "pipeline_aligned": combine_pipeline_reward(schema, ali, PIPELINE).reward,
    }


def wrong_way(kind: str, before: float, after: float) -> bool:
    return after > before + EPS if kind == "worsening" else after < before - EPS


# ---- the audit ---------------------------------------------------------------------------------


def contexts(examples: Sequence[GoldenExample]) -> dict[str, tuple[list[str], list[str]]]:
    """Per source: the column names and non-empty values of its examples (junk for the padding edits)."""
    names: dict[str, set[str]] = defaultdict(set)
    values: dict[str, set[str]] = defaultdict(set)
    for ex in examples:
        src = source_of(ex.id)
        names[src].update(ex.schema_.names())
        values[src].update(str(v) for row in ex.table_dict()["data"] for v in row if v)
    return {s: (sorted(names[s]), sorted(values[s])) for s in names}


def audit_examples(
    examples: Sequence[GoldenExample], seed: int = 0, vocabulary: Iterable[GoldenExample] | None = None
) -> list[dict[str, Any]]:
    """One record per (example, base, edit) that applies: the rewards before and after."""
    rng = random.Random(seed)
    vocab = contexts(list(vocabulary) if vocabulary is not None else examples)
    records = []
    for ex in examples:
        src = source_of(ex.id)
        junk_names, junk_values = vocab.get(src, ([], []))
        names = frozenset(normalize_name(n) for n in ex.schema_.names())
        ctx = Context(names, junk_names, junk_values or ["x"], gold_rows(ex))
        for base_name, base in (("perfect", perfect(ex)), ("damaged", damaged(ex, rng))):
            if base is None:
                continue
            before = rewards(base, ex)
            for kind, edits in (("worsening", WORSENING), ("equivalent", EQUIVALENT)):
                for name, edit in edits.items():
                    edited = edit(base, ctx, rng)
                    if edited is None:
                        continue
                    after = rewards(edited, ex)
                    records.append(
                        {"id": ex.id, "source": src, "base": base_name, "kind": kind, "edit": name,
                         "before": before, "after": after}
                    )  # fmt: skip
    return records


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per reward, edit and source: applicable, wrong-way count and share, mean change."""
    out: dict[str, Any] = {}
    for reward in REWARDS:
        per_edit: dict[str, Any] = {}
        for (kind, edit), group in _group(records, ("kind", "edit")).items():
            per_source = {}
            for src, g in _group(group, ("source",)).items():
                per_source[src[0]] = _stats(g, reward, kind)
            per_edit[edit] = {"kind": kind, **_stats(group, reward, kind), "per_source": per_source}
        wrong = sum(wrong_way(r["kind"], r["before"][reward], r["after"][reward]) for r in records)
        out[reward] = {"edits": per_edit, "applicable": len(records), "wrong_way": wrong,
                       "wrong_way_share": wrong / len(records) if records else 0.0}  # fmt: skip
    return out


def _group(records: Sequence[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[tuple(r[k] for k in keys)].append(r)
    return dict(sorted(groups.items()))


def _stats(group: Sequence[dict[str, Any]], reward: str, kind: str) -> dict[str, Any]:
    deltas = [r["after"][reward] - r["before"][reward] for r in group]
    wrong = sum(wrong_way(kind, r["before"][reward], r["after"][reward]) for r in group)
    return {
        "applicable": len(group),
        "wrong_way": wrong,
        "wrong_way_share": round(wrong / len(group), 4) if group else 0.0,
        "mean_change": round(sum(deltas) / len(deltas), 4) if deltas else 0.0,
        "max_wrong_way_change": round(max((abs(d) for d, r in zip(deltas, group, strict=True)
                                           if wrong_way(kind, r["before"][reward], r["after"][reward])),
                                          default=0.0), 4),
    }  # fmt: skip


def alignment_cost(rows: int = 2000, repeats: int = 3) -> dict[str, Any]:
    """CPU seconds of one aligned table reward for a hostile ``rows`` × ``rows`` one-cell table (14 s
    before the cap and the inverted index were added), with the default cap and without."""
    gold = {"columns": ["a"], "data": [[str(i % 7)] for i in range(rows)]}
    pred = "\n".join(json.dumps({"a": str(i % 5)}) for i in range(rows))
    out: dict[str, Any] = {"rows": rows, "repeats": repeats}
    for label, cap in (("capped", DEFAULT_MAX_ALIGN_ROWS), ("uncapped", rows)):
        times, score = [], 0.0
        for _ in range(repeats):
            t0 = time.process_time()
            score = compute_table_reward_single(pred, gold, ALIGNED, max_align_rows=cap).score
            times.append(time.process_time() - t0)
        out[label] = {"max_align_rows": cap, "best_cpu_s": round(min(times), 4), "score": round(score, 4)}
    return out


def sample_per_source(examples: Sequence[GoldenExample], per_source: int | None, seed: int) -> list[GoldenExample]:
    by_source: dict[str, list[GoldenExample]] = defaultdict(list)
    for ex in examples:
        by_source[source_of(ex.id)].append(ex)
    rng = random.Random(seed)
    out: list[GoldenExample] = []
    for src in sorted(by_source):
        group = by_source[src]
        out += group if per_source is None or per_source >= len(group) else rng.sample(group, per_source)
    return out


def run(
    golden: str | Path | None = None, per_source: int | None = None, quick: bool = False, seed: int = 0,
    split: str = "validation",
) -> dict[str, Any]:  # fmt: skip
    """The audit on ``per_source`` examples of every source of ``split`` (all with None)."""
    folder = golden_dir(golden)
    examples = read_split(folder, split)
    chosen = sample_per_source(examples, per_source if per_source is not None else (40 if quick else None), seed)
    records = audit_examples(chosen, seed, vocabulary=examples)
    summary = summarise(records)
    cost = alignment_cost(400 if quick else 2000)
    defaults_clean = all(summary[r]["wrong_way"] == 0 for r in DEFAULT_REWARDS)
    payload: dict[str, Any] = {
        "benchmark": "reward_audit",
        "run": run_record(quick, noisy=False),
        "split": split,
        "seed": seed,
        "examples": {
            s: sum(1 for e in chosen if source_of(e.id) == s) for s in sorted({source_of(e.id) for e in chosen})
        },
        "records": len(records),
        "summary": summary,
        "alignment_cost": cost,
        "goals": [
            {
                "goal": "default rewards (schema, table aligned, pipeline aligned): 0 wrong-way moves on every edit",
                "value": {r: summary[r]["wrong_way"] for r in DEFAULT_REWARDS},
                "target": 0,
                "met": defaults_clean,
            },
            {
                "goal": f"CPU s of one aligned reward, {cost['rows']}² rows, cap {DEFAULT_MAX_ALIGN_ROWS}",
                "value": cost["capped"]["best_cpu_s"],
                "target": None,
            },
            {
                "goal": "the original positional table reward: wrong-way moves (for contrast)",
                "value": summary["table_positional"]["wrong_way"],
                "target": None,
            },
        ],
    }
    write_result("reward_audit", payload, markdown(payload), quick)
    return payload


def markdown(p: dict[str, Any]) -> str:
    s = p["summary"]
    md = header_md("Reward audit: edits that must not move a reward the wrong way", p["run"])
    md += (
        f"Split `{p['split']}`, seed {p['seed']}, examples per source {p['examples']}, {p['records']} edited "
        "predictions. Each edit is applied to a perfect prediction (the gold table) and to a damaged one "
        f"(about {DAMAGE_SHARE:.0%} of the non-empty cells wrong); worsening edits must not raise a reward, "
        "equivalent edits must not lower it. The pipeline reward uses an oracle executor (the table is the "
        "executor's answer). Cells: wrong-way moves / applicable edits (share).\n\n"
    )
    edits = list(s["schema"]["edits"])
    rows = []
    for edit in edits:
        kind = s["schema"]["edits"][edit]["kind"]
        cells = [f"{s[r]['edits'][edit]['wrong_way']}/{s[r]['edits'][edit]['applicable']} "
                 f"({s[r]['edits'][edit]['wrong_way_share']:.1%})" for r in REWARDS]  # fmt: skip
        rows.append([edit, kind, *cells])
    rows.append(
        ["**all**", "", *[f"{s[r]['wrong_way']}/{s[r]['applicable']} ({s[r]['wrong_way_share']:.1%})" for r in REWARDS]]
    )
    md += md_table(
        ["edit", "must not", *REWARDS],
        [[r[0], "raise" if r[1] == "worsening" else ("lower" if r[1] else ""), *r[2:]] for r in rows],
    )
    md += "\n## Wrong-way moves per source (table rewards)\n\n"
    srcs = sorted(p["examples"])
    prow = []
    for edit in edits:
        for reward in ("table_positional", "table_aligned", "pipeline_aligned"):
            ps = s[reward]["edits"][edit]["per_source"]
            prow.append(
                [edit, reward, *[f"{ps[x]['wrong_way']}/{ps[x]['applicable']}" if x in ps else "–" for x in srcs]]
            )
    md += md_table(["edit", "reward", *srcs], prow)
    c = p["alignment_cost"]
    md += (
        f"\n## Cost of the alignment\n\nOne aligned table reward of a {c['rows']} × {c['rows']}-row one-cell table "
        f"(CPU seconds, best of {c['repeats']}): {c['capped']['best_cpu_s']} s with the default cap of "
        f"{c['capped']['max_align_rows']} rows (score {c['capped']['score']}), {c['uncapped']['best_cpu_s']} s "
        f"without it (score {c['uncapped']['score']}). An earlier version took 14 s for 2,000 × 2,000 "
        "rows before the inverted index and the cap.\n"
    )
    md += "\n## Goals\n\n" + "".join(
        f"- {g['goal']}: {g['value']}"
        + (f" → {'met' if g['met'] else 'NOT met'}\n" if g.get("target") is not None else "\n")
        for g in p["goals"]
    )
    return md

"""The learning run's report from what a GPU node brought back: ``bench/results/learning_gpu.*``.

    python -m bench.learning_gpu --collected DIR --run-info FILE [--partial "base and sft only"]
        [--extra-settings OLD_REPORT.json]

``DIR`` is the run's folder in the unpacked archive of ``scripts/gpu_node/job.sh collect`` (its
``stages.tsv`` in ``../jobs/``; a recipe's folder adds its run record's part times as ``<recipe>:<part>`` and
its phases' results), or of the shell chains it replaced (``ab.sh`` / ``learning.sh collect``)
(``phase_d/metrics.json``, ``stages.tsv``, ``a1_phase_result.json`` or ``<phase>/phase_result.json``,
``<phase>/metrics.jsonl`` and ``<phase>/early_stopping.json`` of each RL phase …); ``FILE`` a JSON object
with ``card``, ``gpus``, ``versions`` and ``commands`` (what ran, written down by whoever ran it).
``--extra-settings`` adds Phase-D settings of an earlier report (e.g. ``base``) that this run did not
score, marked with where they came from. From each RL phase's VERL metrics: the learning curves
(validation metric, reward mean/min/max per step, where early stopping kept its checkpoint) and the
step-time split (generation, log-probs, reference, update); a plot goes to ``learning_gpu.png``.
The JSON keeps a fixed layout:
``phase_d[setting].overall[metric]``, ``phase_d[setting].per_source[src][metric]``,
``stages[name].seconds``, ``gpus``, ``card``, ``test_documents``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from bench.common import RESULTS_DIR, md_table
from trainer.registry.phases import GRPO_PHASES, SFT_PHASES
from trainer.runs.record import RECORD

NAME = "learning_gpu"
# The plain Hugging Face SFT baseline (one epoch per stage, lr 1e-4 linear decay, batch 32,
# bf16, one H100; end to end, greedy, all 3,011 test documents).
HF_BASELINE = {
    "schema_valid": 0.985,
    "schema_f1": 0.967,
    "table_valid": 0.985,
    "cell_accuracy": 0.924,
    "aligned_cell_f1": 0.942,
    "aligned_row_exact_match": 0.825,
}
HF_BASELINE_SECONDS = {"sft_a1": 130.0, "sft_a2": 147.0}
# Its test documents: E2E (536) and RotoWire (2,475); WikiTableText came into the golden data later.
HF_BASELINE_SOURCES = ("e2e", "rotowire_sent")
KEYS = tuple(HF_BASELINE)


def read_stages(
    path: Path, keep: Literal["first", "last"] = "last", ok_only: bool = False
) -> dict[str, dict[str, float]]:
    """``stages.tsv`` lines (name, start, end, seconds[, exit status]): of a stage run twice, its ``keep`` run;
    ``ok_only`` leaves out runs that exited non-zero (a line without a status counts as ok)."""
    out: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) not in (4, 5):
            continue
        name, start, end, seconds = parts[:4]
        rc = int(parts[4]) if len(parts) == 5 and parts[4].strip().lstrip("-").isdigit() else 0
        if (ok_only and rc != 0) or (keep == "first" and name in out):
            continue
        out[name] = {"start": float(start), "end": float(end), "seconds": float(seconds), "rc": float(rc)}
    return out


def record_parts(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A recipe's parts (its run record's ``parts``) as ``<recipe>:<part>``, with the seconds spent starting their
    servers."""
    recipe = record.get("recipe", "run")
    return {
        f"{recipe}:{name}": {"seconds": float(p["seconds"]), "servers_s": float(p.get("servers_s") or 0.0)}
        for name, p in record.get("parts", {}).items()
    }


def baseline_scope(setting: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``setting``'s metrics on the HF baseline's documents: its overall numbers when the test split has no
    other source, else pooled over the baseline's sources (weighted by their documents), so that a source
    the baseline never saw (WikiTableText) does not count against sft."""
    per = setting.get("per_source", {})
    have = [s for s in HF_BASELINE_SOURCES if s in per]
    if not have or set(per) <= set(HF_BASELINE_SOURCES):
        return setting["overall"], f"all {setting['overall'].get('n', '?')} test documents"
    n = sum(int(per[s]["n"]) for s in have)
    pooled = {
        k: sum(float(per[s][k]) * int(per[s]["n"]) for s in have) / n for k in KEYS if all(k in per[s] for s in have)
    }
    return pooled, f"{' + '.join(have)}, {n} test documents (the baseline's sources; pooled)"


def compare_with_baseline(overall: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for k, base in HF_BASELINE.items():
        v = overall.get(k)
        rows.append(
            {
                "metric": k,
                "sft": None if v is None else round(float(v), 4),
                "hf_baseline": base,
                "gap_points": None if v is None else round(100 * (float(v) - base), 2),
                "below": None if v is None else float(v) < base,
            }
        )
    return rows


# VERL's per-step timings (seconds) of a GRPO step; in VERL 0.9.1 the reward is scored inside ``gen``
# (each sample as its rollout finishes, in the agent loop), so it has no key of its own.
STEP_PARTS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rl_curves(rows: list[dict[str, Any]], early: dict[str, Any] | None) -> dict[str, Any]:
    """Per step: the validation metric (``val-core/*``), the training reward's mean/min/max; early stopping."""
    steps: list[dict[str, Any]] = []
    for r in rows:
        d = r.get("data", {})
        val = {k.removeprefix("val-core/"): d[k] for k in d if k.startswith("val-core/")}
        point: dict[str, Any] = {"step": r.get("step")}
        if val:
            point["validation"] = val
        if "critic/score/mean" in d:
            point["reward"] = {q: d.get(f"critic/score/{q}") for q in ("mean", "min", "max")}
            point["entropy"] = d.get("actor/entropy", d.get("actor/entropy_loss"))  # the update's, in bypass mode
            point["kl_loss"] = d.get("actor/kl_loss")
            point["failed_samples"] = d.get("training/rollout_failure/failed_samples")
        steps.append(point)
    out: dict[str, Any] = {"steps": steps}
    if early is not None:
        keys = ("best_step", "best_score", "stopped", "stop_step", "history")
        out["early_stopping"] = {k: early.get(k) for k in keys}
    return out


def validation_per_source(curve: dict[str, Any]) -> list[dict[str, Any]]:
    """Each validated step's reward per source (``val-core/<kind>:<source>/reward/mean@1``, the whole
    validation split), their macro mean, and each one's change from the first validated step (points)."""
    out: list[dict[str, Any]] = []
    first: dict[str, float] | None = None
    for pt in curve["steps"]:
        val = pt.get("validation") or {}
        per = {
            k.split("/", 1)[0].split(":", 1)[1]: float(v)
            for k, v in val.items()
            if ":" in k.split("/", 1)[0] and k.endswith("/reward/mean@1")
        }
        if not per:
            continue
        per["macro"] = sum(per.values()) / len(per)
        first = first or per
        out.append(
            {
                "step": pt["step"],
                "reward": {k: round(v, 4) for k, v in per.items()},
                "change_points": {k: round(100 * (v - first[k]), 2) for k, v in per.items() if k in first},
            }
        )
    return out


def step_split(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per training step of each part, over the steps that logged ``timing_s/step``."""
    timed = [r["data"] for r in rows if "timing_s/step" in r.get("data", {})]
    if not timed:
        return {}
    out = {p: round(sum(float(d.get(f"timing_s/{p}", 0.0)) for d in timed) / len(timed), 3) for p in STEP_PARTS}
    out["step"] = round(sum(float(d["timing_s/step"]) for d in timed) / len(timed), 3)
    out["steps"] = float(len(timed))
    return out


def reward_share(split: dict[str, dict[str, float]]) -> dict[str, Any] | None:
    """The pipeline reward's share of a C1 step, against B1 at the same batch in the same run.

    VERL 0.9.1 scores each sample in its agent loop as its rollout ends, inside ``gen``; what the
    pipeline reward (executor calls) adds over the local reward is C1's ``gen`` minus B1's.
    """
    if "c1" not in split or "b1" not in split:
        return None
    extra = max(0.0, split["c1"]["gen"] - split["b1"]["gen"])
    return {
        "c1_gen_s": split["c1"]["gen"],
        "b1_gen_s": split["b1"]["gen"],
        "c1_step_s": split["c1"]["step"],
        "added_by_pipeline_reward_s": round(extra, 3),
        "share_of_c1_step": round(extra / split["c1"]["step"], 4),
        "goal": 0.10,
    }


def build(
    collected: Path, run_info: dict[str, Any], partial: str | None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    # a run cut off before Phase D still reports its SFT, preflight and RL curves
    pd = collected / "phase_d" / "metrics.json"
    metrics = json.loads(pd.read_text()) if pd.is_file() else {}
    settings: dict[str, Any] = metrics.get("settings", {})
    tsv = next((f for f in (collected / "stages.tsv", collected.parent / "jobs" / "stages.tsv") if f.is_file()), None)
    record = json.loads((collected / RECORD).read_text()) if (collected / RECORD).is_file() else {}
    stages = {**(read_stages(tsv) if tsv else {}), **record_parts(record)}
    phases = {ph: r for ph, r in record.get("phases", {}).items() if ph in (*SFT_PHASES, *GRPO_PHASES)}
    for ph in (*SFT_PHASES, *GRPO_PHASES):
        for f in (collected / f"{ph}_phase_result.json", collected / ph / "phase_result.json"):
            if f.is_file() and ph not in phases:  # a folder without a run record (the shell chains')
                phases[ph] = json.loads(f.read_text())
    from trainer.phase_rules.monitors import DEFAULT_KL_FLOOR, summarise

    curves: dict[str, Any] = {}
    split: dict[str, dict[str, float]] = {}
    monitors: dict[str, Any] = {}
    for ph in GRPO_PHASES:
        f = collected / ph / "metrics.jsonl"
        if f.is_file():
            rows = read_jsonl(f)
            # ab.sh brought it beside the metrics; a phase folder keeps it in checkpoints/
            es = next((c for c in (collected / ph / "early_stopping.json",
                                   collected / ph / "checkpoints" / "early_stopping.json") if c.is_file()), None)
            curves[ph] = rl_curves(rows, json.loads(es.read_text()) if es else None)
            split[ph] = step_split(rows)
            # did the policy move? (the phase result's floor when it recorded one)
            floor = ((phases.get(ph) or {}).get("monitors") or {}).get("kl_floor", DEFAULT_KL_FLOOR)
            monitors[ph] = {k: v for k, v in summarise(rows, floor).items() if k != "steps"}
    phase_d = {
        name: {
            "overall": s["overall"],
            "per_source": s["per_source"],
            **({"macro": s["macro"]} if "macro" in s else {}),
        }
        for name, s in settings.items()
    }
    # EXP=pi2: π2 on GOLD schemas (the B2 target), beside Phase D end to end
    gold_schema = side_eval(collected / "gold_schema_eval" / "metrics.json")
    # π1 on the test split, Stage 1 alone (`trainer infer stage1` + `evaluate score`): the B1 target is a
    # schema F1, so it needs no π2 (measured this way on a run where Phase D did not fit)
    stage1 = side_eval(collected / "stage1_eval" / "metrics.json")
    for name, s in (extra or {}).get("phase_d", {}).items():
        if name not in phase_d:
            phase_d[name] = {**s, "from": extra.get("source") if extra else None}
    n_docs = {name: s["overall"].get("n") for name, s in settings.items()}
    sft_on_baseline, scope = baseline_scope(settings["sft"]) if "sft" in settings else (None, "")
    payload: dict[str, Any] = {
        "benchmark": NAME,
        "partial": partial,
        "card": run_info.get("card"),
        "gpus": run_info.get("gpus"),
        "versions": run_info.get("versions", {}),
        "commands": run_info.get("commands", []),
        "notes": run_info.get("notes", []),
        "test_documents": max((v for v in n_docs.values() if v), default=0),
        "phase_d": phase_d,
        "ci95": {name: s.get("ci95") for name, s in settings.items() if s.get("ci95")},
        "paired_tests": metrics.get("paired_tests", []),
        "stages": stages,
        "sft_phases": {k: v for k, v in phases.items() if k in SFT_PHASES},
        "rl_phases": {k: v for k, v in phases.items() if k in GRPO_PHASES},
        "curves": curves,
        "monitors": monitors,
        "step_time_split_s": split,
        "reward_share_c1": reward_share(split),
        "hf_baseline": {"metrics": HF_BASELINE, "seconds": HF_BASELINE_SECONDS},
        "sft_vs_hf_baseline": compare_with_baseline(sft_on_baseline) if sft_on_baseline is not None else [],
        "sft_vs_hf_baseline_scope": scope,
        "loop2": metrics.get("loop2"),
        "validation_per_source": {ph: validation_per_source(c) for ph, c in curves.items()},
        "gold_schema": gold_schema,
        "stage1": stage1,
    }
    return payload


def side_eval(path: Path) -> dict[str, Any] | None:
    """An `evaluate score` beside Phase D (π2 on gold schemas, π1's schemas alone): its settings and tests."""
    if not path.is_file():
        return None
    m = json.loads(path.read_text())
    keep = ("overall", "per_source", "macro", "ci95")
    return {
        "settings": {name: {k: v for k, v in s.items() if k in keep} for name, s in m["settings"].items()},
        "paired_tests": m.get("paired_tests", []),
    }


def render_md(p: dict[str, Any]) -> str:
    title = "Learning on GPUs: SFT at full scale and Phase D on the whole test split"
    md = f"# {title}" + (f" (partial run: {p['partial']})" if p.get("partial") else "") + "\n\n"
    md += f"- card: {p['card']} × {p['gpus']}\n"
    md += "- versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items()) + "\n"
    md += f"- test documents: {p['test_documents']} end to end"
    if p.get("stage1"):
        n1 = max((s.get("overall", {}).get("n") or 0 for s in p["stage1"]["settings"].values()), default=0)
        md += f"; {n1} scored on Stage 1 alone"
    md += "\n\n"
    names = list(p["phase_d"])
    if not names:
        md += "**No Phase D in this run** (nothing on the test split): " + (p.get("partial") or "not run") + "\n\n"
    if names and all("macro" in p["phase_d"][n] for n in names):
        md += "## Phase D, end to end (greedy): macro mean over sources (the headline)\n\n" + md_table(
            ["metric", *names], [[k, *[p["phase_d"][n]["macro"].get(k, "–") for n in names]] for k in KEYS]
        )
    if names:
        md += "\n## Phase D, end to end (greedy): pooled over documents\n\n" + md_table(
            ["metric", *names], [[k, *[p["phase_d"][n]["overall"].get(k, "–") for n in names]] for k in KEYS]
        )
    sources = sorted({s for n in names for s in p["phase_d"][n]["per_source"]})
    for src in sources:
        md += f"\n### {src}\n\n" + md_table(
            ["metric", *names],
            [
                ["n", *[p["phase_d"][n]["per_source"].get(src, {}).get("n", "–") for n in names]],
                *[[k, *[p["phase_d"][n]["per_source"].get(src, {}).get(k, "–") for n in names]] for k in KEYS],
            ],
        )
    if p["sft_vs_hf_baseline"]:
        below = [r["metric"] for r in p["sft_vs_hf_baseline"] if r["below"]]
        md += "\n## sft against the plain Hugging Face SFT baseline\n\n"
        md += f"On {p.get('sft_vs_hf_baseline_scope') or 'the test split'}.\n\n" + md_table(
            ["metric", "sft", "HF baseline", "gap (points)", "below?"],
            [
                [r["metric"], r["sft"], r["hf_baseline"], r["gap_points"], "yes" if r["below"] else "no"]
                for r in p["sft_vs_hf_baseline"]
            ],
        )
        md += (
            f"\nsft is below the baseline on {len(below)} of {len(KEYS)} metrics"
            + (f" ({', '.join(below)})" if below else "")
            + ".\n"
        )
    if p.get("ci95"):
        md += "\n## 95% bootstrap intervals (documents resampled)\n\n" + md_table(
            ["metric", *p["ci95"]],
            [[k, *[_interval(p["ci95"][n].get("overall", {}).get(k)) for n in p["ci95"]]] for k in KEYS],
        )
    if p.get("paired_tests"):
        md += "\n## Paired bootstrap tests, end to end (same documents, treatment − baseline)\n\n"
        md += _paired_table(p["paired_tests"])
    gs = p.get("gold_schema")
    if gs:
        gnames = list(gs["settings"])
        md += "\n## π2 on gold schemas (B2's target: local ≥ sft + 1 point aligned cell F1)\n\n"
        for scope in ("macro", "overall"):
            if all(scope in gs["settings"][n] for n in gnames):
                label = "macro mean over sources" if scope == "macro" else "pooled"
                md += f"\n{label}:\n\n" + md_table(
                    ["metric", *gnames],
                    [[k, *[gs["settings"][n][scope].get(k, "–") for n in gnames]] for k in KEYS if k != "schema_valid"],
                )
        srcs = sorted({x for n in gnames for x in gs["settings"][n]["per_source"]})
        md += "\naligned cell F1 per source:\n\n" + md_table(
            ["source", *gnames],
            [
                [x, *[gs["settings"][n]["per_source"].get(x, {}).get("aligned_cell_f1", "–") for n in gnames]]
                for x in srcs
            ],
        )
        if gs.get("paired_tests"):
            md += "\nPaired tests on gold schemas:\n\n" + _paired_table(gs["paired_tests"])
    md += _stage1_md(p.get("stage1"))
    for ph, c in p.get("curves", {}).items():
        es = c.get("early_stopping") or {}
        md += f"\n## Learning curve: {ph}\n\n" + md_table(
            ["step", "validation", "reward mean", "reward min", "reward max", "entropy", "kl loss"],
            [
                [
                    pt["step"],
                    ", ".join(f"{k} {v:.4f}" for k, v in pt.get("validation", {}).items()) or "",
                    *[_num(pt.get("reward", {}).get(q)) for q in ("mean", "min", "max")],
                    _num(pt.get("entropy")),
                    _num(pt.get("kl_loss")),
                ]
                for pt in c["steps"]
            ],
        )
        if es:
            md += (
                f"\nEarly stopping kept step {es.get('best_step')} (validation score {_num(es.get('best_score'))});"
                f" stopped early: {'yes at step ' + str(es.get('stop_step')) if es.get('stopped') else 'no'}.\n"
            )
    vps = {ph: rows for ph, rows in (p.get("validation_per_source") or {}).items() if rows}
    if vps:
        md += (
            "\n## Validation reward per source (whole validation split, greedy; change from the first validated"
            " step in points)\n\n"
        )
        srcs = [*sorted({x for rows in vps.values() for r in rows for x in r["reward"] if x != "macro"}), "macro"]

        def cell(r: dict[str, Any], x: str) -> str:
            return f"{r['reward'][x]:.4f} ({r['change_points'][x]:+.2f})" if x in r["reward"] else "–"

        md += md_table(
            ["phase", "step", *srcs],
            [
                [ph, r["step"], *[cell(r, x) for x in srcs]]
                for ph, rows in vps.items()
                for r in rows
            ],
        )
    if p.get("monitors"):
        cols = ("policy_moved", "max_kl_to_ref", "max_abs_ppo_kl", "max_clipfrac", "mean_entropy", "max_grad_norm",
                "evicted_groups", "mean_valid_share")  # fmt: skip
        rows = [
            # 3 significant digits: a KL of 5e-5 must not print as 0.0000
            [ph, *[str(m.get(k)) if k == "policy_moved" or m.get(k) is None else f"{m[k]:.3g}" for k in cols]]
            for ph, m in p["monitors"].items()
        ]
        md += "\n## Did the policy move? (the phase monitors)\n\n" + md_table(["phase", *cols], rows)
        md += "".join(f"\n- {ph}: {m['verdict']}" for ph, m in p["monitors"].items()) + "\n"
    if p.get("step_time_split_s"):
        parts = [*STEP_PARTS, "step"]
        md += "\n## Step time split (mean seconds per training step)\n\n" + md_table(
            ["phase", *parts], [[ph, *[v.get(k, "–") for k in parts]] for ph, v in p["step_time_split_s"].items()]
        )
        r = p.get("reward_share_c1")
        if r:
            md += (
                f"\nReward's share of a C1 step: VERL 0.9.1 scores each sample inside `gen` as its rollout ends, so"
                f" the pipeline reward's cost is C1's `gen` ({r['c1_gen_s']} s) minus B1's ({r['b1_gen_s']} s) at the"
                f" same batch: {r['added_by_pipeline_reward_s']} s of a {r['c1_step_s']} s step ="
                f" {100 * r['share_of_c1_step']:.1f}% (goal ≤ {100 * r['goal']:.0f}%). This is indirect: the reward"
                " has no timer of its own, and `gen` is as long as the longest rollout of the step, so scoring that"
                " overlaps with the other rollouts does not show.\n"
            )
    if p["stages"]:
        md += "\n## Wall time of every stage\n\n" + md_table(
            ["stage", "seconds", "of which starting its servers"],
            [[k, v["seconds"], v.get("servers_s", "")] for k, v in p["stages"].items()],
        )
        hf = HF_BASELINE_SECONDS
        md += f"\nHF baseline SFT: {hf['sft_a1']:.0f} s (π1), {hf['sft_a2']:.0f} s (π2).\n"
    if p["commands"]:
        md += "\n## Commands\n\n" + "\n".join(f"- `{c}`" for c in p["commands"]) + "\n"
    if p["notes"]:
        md += "\n## Notes\n\n" + "\n".join(f"- {n}" for n in p["notes"]) + "\n"
    return md


SCHEMA_KEYS = ("schema_valid", "schema_precision", "schema_recall", "schema_f1")


def _stage1_md(s1: dict[str, Any] | None) -> str:
    """π1's schemas on the test split, per source with 95% intervals, and the paired tests on schema F1."""
    if not s1:
        return ""
    names = list(s1["settings"])
    md = "\n## π1 on the test split, Stage 1 alone (B1's target: local ≥ sft + 2 points schema F1)\n\n"
    srcs = sorted({x for n in names for x in s1["settings"][n]["per_source"]})
    rows = []
    for x in srcs:
        for k in SCHEMA_KEYS:
            cells = []
            for n in names:
                v = s1["settings"][n]["per_source"].get(x, {}).get(k)
                ci = ((s1["settings"][n].get("ci95") or {}).get("per_source", {}).get(x) or {}).get(k)
                cells.append("–" if v is None else f"{float(v):.4f} {_interval(ci)}")
            n_docs = s1["settings"][names[0]]["per_source"].get(x, {}).get("n", "–")
            rows.append([x, n_docs, k, *cells])
    md += md_table(["source", "n", "metric", *[f"{n} [95%]" for n in names]], rows)
    if s1.get("paired_tests"):
        md += "\nPaired tests on π1's schemas:\n\n" + _paired_table(s1["paired_tests"])
    return md


def _per_source(setting: dict[str, Any], source: str, key: str) -> Any:
    return setting["per_source"].get(source, {}).get(key, "–")


def _paired_table(tests: list[dict[str, Any]]) -> str:
    return md_table(
        ["metric", "baseline → treatment", "scope", "n", "diff (points)", "95% interval (points)", "p"],
        [
            [
                t["metric"],
                f"{t['baseline']} → {t['treatment']}",
                t.get("scope", "pooled"),
                t["n"],
                f"{100 * t['diff']:+.2f}",
                f"[{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]",
                t["p_value"],
            ]
            for t in tests
        ],
    )


def _num(v: Any) -> str:
    return "" if v is None else f"{float(v):.4f}"


def _interval(v: Any) -> str:
    return "–" if not v else f"[{float(v[0]):.3f}, {float(v[1]):.3f}]"


def plot(p: dict[str, Any], path: Path) -> Path | None:
    """Learning curves (validation metric and training reward per step) and the step-time split."""
    if not p.get("curves"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    for ph, c in p["curves"].items():
        pts = [pt for pt in c["steps"] if "reward" in pt and pt["reward"]["mean"] is not None]
        line = ax.plot([pt["step"] for pt in pts], [pt["reward"]["mean"] for pt in pts], label=f"{ph} reward mean")[0]
        val = [(r["step"], r["reward"]["macro"]) for r in (p.get("validation_per_source") or {}).get(ph, [])]
        if not val:  # untagged data_source: the first validation metric
            val = [(pt["step"], next(iter(pt["validation"].values()))) for pt in c["steps"] if pt.get("validation")]
        ax.plot([v[0] for v in val], [v[1] for v in val], "o--", color=line.get_color(), label=f"{ph} validation")
        best = (c.get("early_stopping") or {}).get("best_step")
        if best is not None:
            ax.axvline(best, color=line.get_color(), alpha=0.3, linestyle=":")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title("RL curves (dotted line: step early stopping kept)")
    ax.legend(fontsize=8)
    ax = axes[1]
    split = p.get("step_time_split_s", {})
    left = [0.0] * len(split)
    for part in STEP_PARTS:
        vals = [split[ph].get(part, 0.0) for ph in split]
        ax.barh(list(split), vals, left=left, label=part)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("seconds per step (mean)")
    ax.set_title("GRPO step time split")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collected", type=Path, required=True)
    ap.add_argument("--run-info", type=Path, required=True)
    ap.add_argument("--partial", default=None, help="Say what the run left out (marks the report partial).")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--name", default=NAME, help="Result file stem (e.g. learning_gpu_pi2 for the π2 A/B).")
    ap.add_argument(
        "--extra-settings", type=Path, default=None, help="An earlier learning_gpu.json: its settings this run lacks."
    )
    a = ap.parse_args(argv)
    extra = None
    if a.extra_settings is not None:
        extra = json.loads(a.extra_settings.read_text())
        extra["source"] = f"{a.extra_settings.name} ({extra.get('card')}, {', '.join(extra.get('commands', [])[:1])})"
    payload = build(a.collected, json.loads(a.run_info.read_text()), a.partial, extra)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{a.name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (a.out_dir / f"{a.name}.md").write_text(render_md(payload))
    plot(payload, a.out_dir / f"{a.name}.png")
    print(f"wrote {a.out_dir / a.name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

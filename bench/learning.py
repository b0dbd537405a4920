"""Learning results: Phase D on the test split of every trained setting, per source, with paired tests.

``python -m bench learning --collected DIR [--collected DIR2 ...]`` reads the unpacked archives of
``scripts/gpu_node/rft.sh`` runs (``job.sh collect``) and writes ``bench/results/learning.{json,md,png}``:

- ``phase_d[setting]``: ``overall`` (macro over sources, with its 95% interval, and pooled) and
  ``per_source[src]`` (mean, n, interval) of the end-to-end aligned cell F1, and ``schema_f1`` the same way;
  with several runs (seeds), the first run's numbers and each run's under ``per_seed``;
- ``paired[i]``: ``baseline``, ``treatment``, ``scope`` (macro, pooled or a source), ``metric``, ``diff``,
  ``low``, ``high``, ``p``, ``seeds`` (the runs the test pools: documents of every run, paired by run);
- ``sft`` and ``rft``: what each trained model was trained on and how (kept samples per source, best reward,
  the exported epoch and its validation loss), ``stages`` (seconds per job and per wave), ``card``, ``versions``,
  ``run`` (the node script's settings, its commit and command), ``targets`` (each met or not, with its number).

Choices (the SFT and RFT epochs) were made on validation on the node; the test split is read once here.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, md_table, write_result
from bench.sft_mix import stage_seconds, val_loss_curve

NAME = "learning"
METRIC = "aligned_cell_f1"
BASELINE = "sft"
FOCUS = "wikitabletext"  # the source the targets name: the one the models are weakest on
TARGET_GAIN = 0.02  # best RL or RFT arm ≥ sft + 2 points, end to end on FOCUS
TARGET_ABSOLUTE = 0.60  # end-to-end aligned cell F1 on FOCUS


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_root(collected: Path) -> Path:
    """The node script's folder inside an unpacked archive (the one holding run_info.json), or the archive."""
    roots = sorted(d for d in collected.iterdir() if (d / "run_info.json").is_file())
    return roots[0] if len(roots) == 1 else collected


def _wave_seconds(path: Path) -> dict[str, int]:
    """rft.sh's waves.tsv: NAME<TAB>seconds per wave (a rerun of a wave: its last time)."""
    out: dict[str, int] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 2:
                out[parts[0]] = int(parts[1])
    return out


def _trained(folder: Path) -> dict[str, Any]:
    """One SFT-launcher run (A1/A2, or an RFT model's fine-tuning): status, exported step, the loss curve."""
    result = folder / "phase_result.json"
    r = _read(result) if result.is_file() else {}
    return {
        "status": r.get("status"),
        "exported_step": r.get("best_step"),
        "epoch_selection": r.get("epoch_selection"),
        "seconds": r.get("seconds"),
        "command": " ".join(r.get("command", [])) or None,
        "val_loss": val_loss_curve(folder / "metrics.jsonl"),
    }


def _setting(s: Mapping[str, Any], metric: str) -> dict[str, Any]:
    ci = s.get("ci95", {})
    return {
        "overall": {
            "macro": s["macro"].get(metric),
            "macro_ci": ci.get("macro", {}).get(metric),
            "pooled": s.get("overall", {}).get(metric),
        },
        "per_source": {
            src: {"mean": v.get(metric), "n": v.get("n"), "ci": ci.get("per_source", {}).get(src, {}).get(metric)}
            for src, v in sorted(s["per_source"].items())
        },
        "truncated": s.get("truncated", {}),
    }


def build_run(collected: Path) -> dict[str, Any]:
    """One node run: its settings, trained models, stage times and Phase D (metrics.json of the test wave)."""
    root = run_root(collected)
    info = _read(root / "run_info.json") if (root / "run_info.json").is_file() else {}
    p: dict[str, Any] = {
        "run": info,
        "card": "; ".join(x for x in (collected / "card.txt").read_text().split("\n") if x)
        if (collected / "card.txt").is_file()
        else None,
        "versions": _read(collected / "versions.json") if (collected / "versions.json").is_file() else {},
        "stages": {
            "jobs": stage_seconds(collected),
            "waves": _wave_seconds(root / "waves.tsv"),
        },
        "sft": {phase: _trained(root / phase) for phase in ("a1", "a2") if (root / phase).is_dir()},
        "rft": {},
    }
    for folder in sorted(root.glob("rft_*")):
        report = folder / "rft_report.json"
        if folder.is_dir() and report.is_file():
            p["rft"][folder.name] = {"data": _read(report), "training": _trained(folder / "sft")}
    test = root / "test" / "metrics.json"
    if test.is_file():
        m = _read(test)
        p["phase_d"] = {name: _setting(s, METRIC) for name, s in m["settings"].items()}
        p["schema_f1"] = {name: _setting(s, "schema_f1") for name, s in m["settings"].items()}
        p["paired"] = [_paired_row(t, 1) for t in m.get("paired_tests", [])]
        p["max_tokens"] = m.get("max_tokens")
        p["serving"] = m.get("serving")
    p["rows"] = {
        f.name.removeprefix("test_rows_").removesuffix(".jsonl.gz"): f for f in root.glob("test_rows_*.jsonl.gz")
    }
    return p


def _paired_row(t: Mapping[str, Any], seeds: int) -> dict[str, Any]:
    return {
        "baseline": t["baseline"],
        "treatment": t["treatment"],
        "scope": t["scope"],
        "metric": t["metric"],
        "n": t["n"],
        "diff": t["diff"],
        "low": t["ci_low"],
        "high": t["ci_high"],
        "p": t["p_value"],
        "seeds": seeds,
    }


def pooled_paired(runs: Sequence[Mapping[str, Any]], metric: str = METRIC) -> list[dict[str, Any]]:
    """Paired tests over the runs (each run one seed), each document once: its metric averaged over the runs
    first (:func:`trainer.evaluation.significance.mean_over_seeds`), for the settings every run has, in the
    first run's order, against sft and the one before."""
    from trainer.evaluation.phase_d import comparison_pairs
    from trainer.evaluation.significance import mean_over_seeds, paired_tests

    names = [n for n in runs[0]["rows"] if all(n in r["rows"] for r in runs)]
    order = list(runs[0].get("phase_d", {}))
    names.sort(key=lambda n: order.index(n) if n in order else len(order))
    scored = {name: mean_over_seeds([_jsonl(Path(r["rows"][name])) for r in runs], metric) for name in names}
    return [_paired_row(t, len(runs)) for t in paired_tests(scored, comparison_pairs(names), metric)]


def targets(phase_d: Mapping[str, Any], paired: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The learning targets, each with the number it rests on and met or not (one seed: say so)."""
    out: list[dict[str, Any]] = []
    vs_sft = [t for t in paired if t["baseline"] == BASELINE and t["metric"] == METRIC]
    focus = [t for t in vs_sft if t["scope"] == FOCUS]
    if focus:
        best = max(focus, key=lambda t: t["diff"])
        out.append(
            {
                "target": f"best arm − sft on {FOCUS}, end to end, ≥ +{100 * TARGET_GAIN:.0f} points (paired)",
                "value": f"{best['treatment']}: {_signed(best['diff'], (best['low'], best['high']))}",
                "met": best["diff"] >= TARGET_GAIN and best["low"] > 0,
            }
        )
    if phase_d:
        best_abs = max(phase_d.items(), key=lambda kv: kv[1]["per_source"].get(FOCUS, {}).get("mean") or 0)
        value = best_abs[1]["per_source"].get(FOCUS, {}).get("mean")
        if value is not None:
            out.append(
                {
                    "target": f"{FOCUS} end-to-end aligned cell F1 ≥ {TARGET_ABSOLUTE:.2f}",
                    "value": f"{best_abs[0]}: {value:.4f}",
                    "met": value >= TARGET_ABSOLUTE,
                }
            )
    worse = [t for t in vs_sft if t["scope"] not in ("macro", "pooled") and t["high"] < 0]
    if vs_sft:
        out.append(
            {
                "target": "no source worse than sft beyond its interval",
                "value": ", ".join(f"{t['treatment']} on {t['scope']} {100 * t['diff']:+.2f}" for t in worse)
                or "none worse",
                "met": not worse,
            }
        )
        macro = [t for t in vs_sft if t["scope"] == "macro"]
        below = [t for t in macro if t["diff"] < 0]
        out.append(
            {
                "target": "the macro mean never below sft",
                "value": ", ".join(f"{t['treatment']} {100 * t['diff']:+.2f}" for t in macro),
                "met": not below,
            }
        )
    return out


def build(collected: Sequence[Path]) -> dict[str, Any]:
    runs = [build_run(c) for c in collected]
    first = runs[0]
    p: dict[str, Any] = {k: first.get(k) for k in ("run", "card", "versions", "stages", "sft", "rft", "max_tokens")}
    p["seeds"] = {
        "runs": len(runs),
        "rft_seed": [r["run"].get("rft_seed") for r in runs],
        "note": "each run is one seed of every arm: its SFT (VERL's data seed), its RFT sampling (rft_seed)",
    }
    p["phase_d"] = first.get("phase_d", {})
    p["schema_f1"] = first.get("schema_f1", {})
    if len(runs) > 1:
        for name in p["phase_d"]:
            p["phase_d"][name]["per_seed"] = [r.get("phase_d", {}).get(name, {}).get("overall") for r in runs]
        p["paired"] = pooled_paired(runs)
        p["paired_per_seed"] = [r.get("paired", []) for r in runs]
    else:
        p["paired"] = first.get("paired", [])
    first_setting: Mapping[str, Any] = next(iter(p["phase_d"].values()), {})
    p["test_documents"] = sum(int(s.get("n") or 0) for s in first_setting.get("per_source", {}).values())
    p["targets"] = targets(p["phase_d"], p["paired"])
    return p


def _signed(diff: float, ci: tuple[float, float]) -> str:
    return f"{100 * diff:+.2f} [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"


def _pt(x: Any, ci: Any = None) -> str:
    if x is None:
        return "–"
    s = f"{100 * float(x):.2f}"
    return f"{s} [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]" if ci else s


def _phase_d_rows(table: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    sources = sorted({src for s in table.values() for src in s["per_source"]})
    rows = [
        [
            name,
            *(_pt(s["per_source"].get(src, {}).get("mean"), s["per_source"].get(src, {}).get("ci")) for src in sources),
            _pt(s["overall"]["macro"], s["overall"]["macro_ci"]),
        ]
        for name, s in table.items()
    ]
    return ["setting", *sources, "macro"], rows


def render_md(p: Mapping[str, Any], command: str) -> str:
    run = p.get("run") or {}
    v = p.get("versions") or {}
    lines = [
        "# Learning: Phase D of every trained setting on the test split",
        "",
        f"- card: {p.get('card')}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- on the node: `{run.get('command')}` at `{run.get('commit')}`; settings: "
        + ", ".join(
            f"{k} `{run[k]}`"
            for k in (
                "sft_args",
                "sft_mix",
                "rft_args",
                "rft_rewards",
                "rft_k",
                "rft_threshold",
                "rft_per_source",
                "rft_flags",
                "rft_seed",
                "max_tokens",
                "gpus",
            )
            if k in run
        ),
        f"- this report: `{command}`",
        f"- seeds: {p['seeds']['runs']} run(s); {p['seeds']['note']}",
        f"- numbers are points (×100) with 95% bootstrap intervals over the {p.get('test_documents')} test documents;"
        " paired tests are treatment − baseline over the same documents",
        "",
    ]
    if p.get("phase_d"):
        head, rows = _phase_d_rows(p["phase_d"])
        lines += ["## End to end: aligned cell F1 (π1 writes the schema, π2 fills it)", "", md_table(head, rows)]
        head, rows = _phase_d_rows(p["schema_f1"])
        lines += ["## Stage 1: schema F1 of π1's schemas", "", md_table(head, rows)]
    if p.get("paired"):
        rows = [
            [
                f"{t['baseline']} → {t['treatment']}",
                t["scope"],
                t["n"],
                f"{100 * t['diff']:+.2f}",
                f"[{100 * t['low']:+.2f}, {100 * t['high']:+.2f}]",
                f"{t['p']:.3f}",
                t["seeds"],
            ]
            for t in p["paired"]
            if t["metric"] == METRIC
        ]
        lines += [
            "## Paired tests, end to end (aligned cell F1)",
            "",
            md_table(["pair", "scope", "n", "diff", "95% interval", "p", "seeds"], rows),
        ]
    if p.get("targets"):
        rows = [[t["target"], t["value"], "met" if t["met"] else "NOT met"] for t in p["targets"]]
        lines += ["## Targets", "", md_table(["target", "value", "result"], rows)]
    trained = [
        [
            name,
            s.get("status"),
            s.get("exported_step"),
            s.get("seconds"),
            ", ".join(f"{st}: {loss:.4f}" for st, loss in s.get("val_loss", [])),
        ]
        for name, s in {**(p.get("sft") or {}), **{k: r["training"] for k, r in (p.get("rft") or {}).items()}}.items()
    ]
    if trained:
        lines += [
            "## Trained models (validation loss by step; the exported step chosen on it)",
            "",
            md_table(["model", "status", "exported step", "phase s", "val loss (step: loss)"], trained),
        ]
    if p.get("rft"):
        rows = []
        for name, r in p["rft"].items():
            d = r["data"]
            per = d.get("prompts_per_source") or {}
            kept = d.get("kept_per_source") or {}
            best = d.get("mean_best_reward_per_source") or {}
            rows += [[name, d["reward"], src, n, kept.get(src, 0), best.get(src, "–")] for src, n in per.items()]
            rows.append([name, d["reward"], "all", d["prompts"], d["kept"], d["mean_best_reward"]])
            rows[-1].append(f"{d.get('truncated', 0)} of {d['samples']} samples cut at the token limit")
        for r in rows:
            r += [""] * (7 - len(r))
        lines += [
            "## RFT data (k samples per prompt, the best kept when its reward ≥ the threshold)",
            "",
            md_table(["model", "reward", "source", "prompts", "kept", "mean best reward", "note"], rows),
        ]
    stages = p.get("stages") or {}
    if stages.get("jobs") or stages.get("waves"):
        rows = [["job", k, s] for k, s in stages.get("jobs", {}).items()]
        rows += [["wave", k, s] for k, s in stages.get("waves", {}).items()]
        lines += ["## Stage times (seconds)", "", md_table(["kind", "name", "seconds"], rows)]
    return "\n".join(lines) + "\n"


def plot(p: Mapping[str, Any], path: Path) -> Path | None:
    """Left: each setting's end-to-end aligned cell F1 per source with its 95% interval. Right: each setting −
    sft per source with its paired 95% interval (the seeds pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = p.get("phase_d") or {}
    if not table:
        return None
    sources = sorted({src for s in table.values() for src in s["per_source"]})
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(table)
    for k, (name, s) in enumerate(table.items()):
        xs = [i + width * k for i in range(len(sources) + 1)]
        vals = [100 * (s["per_source"][src]["mean"] or 0) for src in sources] + [100 * (s["overall"]["macro"] or 0)]
        cis = [s["per_source"][src]["ci"] for src in sources] + [s["overall"]["macro_ci"]]
        err = [
            [v - 100 * c[0] if c else 0 for v, c in zip(vals, cis, strict=True)],
            [100 * c[1] - v if c else 0 for v, c in zip(vals, cis, strict=True)],
        ]
        a.bar(xs, vals, width=width, yerr=err, capsize=2, label=name)
    a.set_xticks([i + 0.4 - width / 2 for i in range(len(sources) + 1)], [*sources, "macro"])
    a.set(ylabel="aligned cell F1, end to end (points)", title="Phase D on test, 95% intervals")
    a.legend(fontsize=8)
    vs = [
        t for t in p.get("paired", []) if t["baseline"] == BASELINE and t["metric"] == METRIC and t["scope"] != "pooled"
    ]
    treats = list(dict.fromkeys(t["treatment"] for t in vs))
    scopes = [*sources, "macro"]
    for k, name in enumerate(treats):
        got = {t["scope"]: t for t in vs if t["treatment"] == name}
        step = 0.6 / max(len(treats), 1)
        xs = [i - 0.3 + step * (k + 0.5) for i, sc in enumerate(scopes) if sc in got]
        ts = [got[sc] for sc in scopes if sc in got]
        b.errorbar(
            xs,
            [100 * t["diff"] for t in ts],
            yerr=[[100 * (t["diff"] - t["low"]) for t in ts], [100 * (t["high"] - t["diff"]) for t in ts]],
            fmt="o",
            capsize=3,
            label=name,
            color=f"C{list(table).index(name) % 10}" if name in table else None,
        )
    b.axhline(0, color="grey", lw=0.8)
    b.axhline(100 * TARGET_GAIN, color="green", lw=0.8, ls="--", label=f"target on {FOCUS}")
    b.set_xticks(list(range(len(scopes))), scopes)
    b.set(ylabel="setting − sft (points)", title=f"Paired against sft ({p['seeds']['runs']} seed(s) pooled)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(collected: Sequence[Path], notes: Path | None = None, name: str = NAME) -> dict[str, Any]:
    p = build(collected)
    command = "python -m bench learning " + " ".join(f"--collected {c}" for c in collected)
    md = render_md(p, command)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    png = plot(p, RESULTS_DIR / f"{name}.png")
    if png:
        md += f"\n![Phase D per source and paired against sft]({png.name})\n"
    if notes:
        md += "\n" + notes.read_text()
    write_result(name, {**p, "command": command}, md, quick=False)
    return p

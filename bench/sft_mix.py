"""Two SFT recipes, chosen on validation and compared on test; and whether an evaluation repeats exactly.

``scripts/gpu_node/sft_mix.sh`` runs on a GPU node: A1 and A2 each trained with the reference recipe
(``base``) and with a treatment recipe whose name the script records in ``run_info.json`` (``treatment``;
``mix`` where none is named: the train split reweighted by source, ``trainer data build --sft-mix``; or, e.g.,
other batch sizes and epochs chosen on validation); each model then scored on the validation split;
``python -m bench sft-mix choose ROOT`` picks per policy; Phase D runs on the test split for sft (both
``base``) and the chosen pair (a setting named after the treatment). Then, here, ``python -m bench sft-mix
report --collected DIR [--name NAME]`` reads the unpacked ``job.sh collect`` archive and writes
``bench/results/NAME.{json,md,png}``.

The choice (fixed before the run): per policy, the variant with the higher **macro mean over sources on
validation**: π1 by schema F1 of its own schemas, π2 by aligned cell F1 on the gold schemas (apart from π1's
mistakes). A tie keeps ``base``. The test split is read once, after the choice.

The repeat check: π1 (``a1_base``) writes the schemas of one source's validation documents three times per
mode (vLLM's default, and ``VLLM_BATCH_INVARIANT=1``): twice at concurrency 256, once at 32. An evaluation
repeats when every answer is the same text; the report gives the answers that differ and the schema F1 of
each run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, md_table, write_result

NAME = "sft_mix"
BASE = "base"
DEFAULT_TREATMENT = "mix"  # the node script's treatment where its run_info.json names none
DEFAULT_BATCH = 32  # data.train_batch_size of the gpu SFT profile, where a run's command sets none
# what each policy is chosen by on validation, and the folder its two variants were scored into
CHOICE_METRIC = {"pi1": ("schema_f1", "val_pi1"), "pi2": ("aligned_cell_f1", "val_pi2")}
REPEAT_MODES = ("default", "batch_invariant")
REPEAT_RUNS = ("c256_1", "c256_2", "c32")  # sft_mix.sh's runs; repeat_check.sh runs c16 as its third


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def treatment_of(info: Mapping[str, Any]) -> str:
    """The treatment variant's name in a node run's ``run_info.json``."""
    return str(info.get("treatment") or DEFAULT_TREATMENT)


def sft_runs(treatment: str) -> tuple[str, ...]:
    return (f"a1_{BASE}", f"a1_{treatment}", f"a2_{BASE}", f"a2_{treatment}")


def _run_info(root: Path) -> dict[str, Any]:
    path = root / "run_info.json"
    return dict(_read(path)) if path.is_file() else {}


def macro_paired(tests: Sequence[Mapping[str, Any]], base: str, treat: str) -> dict[str, Any] | None:
    for t in tests:
        if t.get("scope") == "macro" and t["baseline"] == base and t["treatment"] == treat:
            return dict(t)
    return None


def choose(root: Path) -> dict[str, Any]:
    """Per policy, ``base`` or the treatment by its validation metric's macro mean; written to
    ``ROOT/choice.json``."""
    treat = treatment_of(_run_info(root))
    out: dict[str, Any] = {}
    for policy, (metric, folder) in CHOICE_METRIC.items():
        path = root / folder / "metrics.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the validation scores of {policy}'s two variants are missing")
        m = _read(path)
        means = {}
        for v in (BASE, treat):
            value = m["settings"].get(v, {}).get("macro", {}).get(metric)
            if value is None or not math.isfinite(float(value)):
                raise ValueError(f"{path}: setting {v!r} has no macro {metric}")
            means[v] = float(value)
        chosen = treat if means[treat] > means[BASE] else BASE
        out[policy] = {
            "metric": metric,
            "split": "validation",
            "treatment": treat,
            "macro": means,
            "chosen": chosen,
            "paired": macro_paired(m.get("paired_tests", []), BASE, treat),
        }
    (root / "choice.json").write_text(json.dumps(out, indent=2) + "\n")
    for policy, c in out.items():
        print(
            f"{policy}: {c['chosen']} ({c['metric']} macro on validation: base {c['macro'][BASE]:.4f}, "
            f"{treat} {c['macro'][treat]:.4f})"
        )
    return out


def repeat_summary(root: Path) -> dict[str, Any]:
    """Per mode: how many answers of each run differ from the first run's, and each run's schema F1."""
    from shared import read_golden
    from trainer.evaluation.phase_d import load_predictions, score_predictions

    golden_path = root / "val" / "repeat_golden.jsonl"
    if not golden_path.is_file():
        return {}
    golden = read_golden(golden_path)
    out: dict[str, Any] = {"documents": len(golden)}
    # a mode is a file name's part before its run (``<mode>_c256_1.jsonl``): two runs at concurrency 256 and
    # one or more at a lower one (c32 here, c16 in repeat_check.sh); each is compared with the first
    files = {f.stem for f in (root / "repeat").glob("*_c*.jsonl")}
    modes = sorted({f.rsplit("_c", 1)[0].removesuffix("_c256") for f in files})
    for mode in sorted(modes, key=lambda m: (m not in REPEAT_MODES, m)):
        lower = sorted(f[len(mode) + 1 :] for f in files if f.startswith(mode + "_c") and "c256" not in f)
        runs = {r: root / "repeat" / f"{mode}_{r}.jsonl" for r in (*REPEAT_RUNS[:2], *(lower or REPEAT_RUNS[2:]))}
        if not all(p.is_file() for p in runs.values()):
            out[mode] = {"missing": sorted(r for r, p in runs.items() if not p.is_file())}
            continue
        answers = {r: {str(x["id"]): str(x["prediction"]) for x in _jsonl(p)} for r, p in runs.items()}
        first = answers[REPEAT_RUNS[0]]
        row: dict[str, Any] = {}
        for r, p in runs.items():
            scored = score_predictions(golden, load_predictions(p))
            differ = sorted(i for i in first if answers[r].get(i) != first[i])
            row[r] = {
                "answers": len(answers[r]),
                "differ_from_first": len(differ),
                "differ_ids": differ[:10],
                "schema_f1": round(sum(float(s["schema_f1"]) for s in scored) / len(scored), 6),
            }
        row["repeats"] = all(v["differ_from_first"] == 0 for v in row.values())
        out[mode] = row
    return out


def val_loss_curve(metrics: Path) -> list[tuple[int, float]]:
    if not metrics.is_file():
        return []
    rows = _jsonl(metrics)
    return [(int(r["step"]), float(r["data"]["val/loss"])) for r in rows if "val/loss" in r.get("data", {})]


def train_batch_size(command: Sequence[str]) -> int:
    """``data.train_batch_size`` of an SFT phase's command (the profile's where the command sets none)."""
    for arg in command:
        if arg.startswith("data.train_batch_size="):
            return int(arg.split("=", 1)[1])
    return DEFAULT_BATCH


def stage_seconds(collected: Path) -> dict[str, int]:
    path = collected / "jobs" / "stages.tsv"
    out: dict[str, int] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                out[parts[0]] = int(parts[3])
    return out


def _setting_table(m: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """Per setting: the metric's macro and per-source means with their 95% intervals, and n per source."""
    out: dict[str, Any] = {}
    for name, s in m["settings"].items():
        ci = s.get("ci95", {})
        out[name] = {
            "macro": s["macro"].get(metric),
            "macro_ci": ci.get("macro", {}).get(metric),
            "per_source": {
                src: {"mean": v.get(metric), "n": v.get("n"), "ci": ci.get("per_source", {}).get(src, {}).get(metric)}
                for src, v in s["per_source"].items()
            },
            "truncated": s.get("truncated", {}),
        }
    return out


def build(collected: Path) -> dict[str, Any]:
    from bench.rl_step import sft_summary

    # the node script's folder (MIX_OUT, packed by `job.sh collect` under its own name), or the archive itself
    roots = sorted(d for d in collected.iterdir() if (d / "run_info.json").is_file()) if collected.is_dir() else []
    root = roots[0] if len(roots) == 1 else collected
    info = _run_info(root)
    treat = treatment_of(info)
    seconds = stage_seconds(collected)
    manifest = root / f"data_{treat}_manifest.json"
    mix = _read(manifest)["phases"]["a1"].get("sft_mix") if manifest.is_file() else None
    sft = {}
    for name in sft_runs(treat):
        result = root / name / "phase_result.json"
        r = _read(result) if result.is_file() else {}
        metrics = _jsonl(root / name / "metrics.jsonl") if (root / name / "metrics.jsonl").is_file() else []
        steps = max((int(m["step"]) for m in metrics), default=r.get("best_step"))
        log = root / name / "train.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        loop = sft_summary(text, root / name / "metrics.jsonl", None)
        sft[name] = {
            "status": r.get("status"),
            "steps": steps,
            "epoch_s": loop.get("epoch_s"),  # the last epoch's loop time (tqdm), validation and saving included
            "exported_step": r.get("best_step"),
            "batch": train_batch_size(r.get("command", [])),
            "phase_seconds": r.get("seconds"),
            "job_seconds": seconds.get(name),
            "val_loss": val_loss_curve(root / name / "metrics.jsonl"),
            "epoch_selection": r.get("epoch_selection"),
        }
    p: dict[str, Any] = {
        "run": info,
        "treatment": treat,
        "card": "; ".join((collected / "card.txt").read_text().split("\n")).strip("; ")
        if (collected / "card.txt").is_file()
        else None,
        "versions": _read(collected / "versions.json") if (collected / "versions.json").is_file() else {},
        "sft_mix": mix,
        "sft": sft,
        "stages": seconds,
        "choice": _read(root / "choice.json") if (root / "choice.json").is_file() else None,
        "validation": {},
        "repeat": repeat_summary(root),
    }
    for policy, (metric, folder) in CHOICE_METRIC.items():
        path = root / folder / "metrics.json"
        if path.is_file():
            p["validation"][policy] = {"metric": metric, "settings": _setting_table(_read(path), metric)}
    rows = {f.name.removeprefix("test_rows_").removesuffix(".jsonl.gz"): f for f in root.glob("test_rows_*.jsonl.gz")}
    if rows:
        p["test_rows"] = {name: str(f) for name, f in sorted(rows.items())}
    test = root / "test" / "metrics.json"
    if test.is_file():
        m = _read(test)
        p["test"] = {
            "metric": "aligned_cell_f1",
            "phase_d": _setting_table(m, "aligned_cell_f1"),
            "schema_f1": _setting_table(m, "schema_f1"),
            "paired": m.get("paired_tests", []),
            "max_tokens": m.get("max_tokens"),
        }
    return p


def _pt(x: Any, ci: Any = None) -> str:
    if x is None:
        return "–"
    s = f"{100 * float(x):.2f}"
    return f"{s} [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]" if ci else s


def _per_source_rows(table: Mapping[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for name, s in table.items():
        rows.append([name, "macro", "–", _pt(s["macro"], s["macro_ci"])])
        rows += [[name, src, v["n"], _pt(v["mean"], v["ci"])] for src, v in s["per_source"].items()]
    return rows


def render_md(p: dict[str, Any], command: str) -> str:
    run, v = p["run"], p["versions"]
    treat = p.get("treatment", DEFAULT_TREATMENT)
    title = "SFT source mix" if treat == DEFAULT_TREATMENT else f"SFT recipes, {treat} against base"
    lines = [
        f"# {title}: chosen on validation, compared on test{'; evaluations that repeat' if p['repeat'] else ''}\n",
        f"- card: {p['card']}",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- on the node: `{run.get('command')}` at `{run.get('commit')}`, {treat}'s mix `{run.get('sft_mix') or '–'}`, "
        f"val loss every {run.get('sft_test_freq')} steps, max tokens {run.get('max_tokens')}"
        + "".join(f", {k} `{run[k]}`" for k in ("base_args", "treatment_args", "treatment_mix") if run.get(k)),
        f"- this report: `{command}`",
        "- numbers are points (×100) with 95% bootstrap intervals; paired tests are "
        f"{treat} − base (or {treat} − sft) over the same documents\n",
    ]
    if p["sft_mix"]:
        m = p["sft_mix"]
        rows = [
            [s, m["train_before"].get(s, 0), m["train_after"].get(s, 0), m["weights"].get(s, 1.0)]
            for s in sorted(m["train_before"])
        ]
        lines += [f"## The train split per source ({treat})\n", md_table(["source", "golden", treat, "weight"], rows)]
    rows = []
    for name, s in p["sft"].items():
        curve = ", ".join(f"{step}: {loss:.4f}" for step, loss in s["val_loss"])
        batch = s.get("batch", DEFAULT_BATCH)
        sel = s.get("epoch_selection") or {}
        exported = f"{s.get('exported_step')} (epoch {sel['chosen_epoch']:g})" if sel else s.get("exported_step", "–")
        seconds = [s.get("epoch_s") or "–", s["phase_seconds"], s["job_seconds"]]
        rows.append([name, s["status"], batch, s["steps"], exported, *seconds, curve or "–"])
    head = ["run", "status", "batch", "steps", "exported step", "epoch s", "phase s", "job s", "val loss (step: loss)"]
    lines += ["## SFT runs (one GPU each), and the validation loss by step\n", md_table(head, rows)]
    for policy, val in p["validation"].items():
        title = "π1: schema F1 of its schemas" if policy == "pi1" else "π2: aligned cell F1 on the gold schemas"
        lines += [
            f"## Validation, {title}\n",
            md_table(["variant", "source", "n", val["metric"]], _per_source_rows(val["settings"])),
        ]
    if p["choice"]:
        rows = []
        for policy, c in p["choice"].items():
            pair = c.get("paired") or {}
            ci = f"[{100 * pair['ci_low']:+.2f}, {100 * pair['ci_high']:+.2f}]" if pair else ""
            diff = f"{100 * pair['diff']:+.2f} {ci}" if pair else "–"
            rows.append([policy, c["metric"], _pt(c["macro"][BASE]), _pt(c["macro"][treat]), diff, c["chosen"]])
        lines += [
            "## The choice (validation, macro mean over sources)\n",
            md_table(["policy", "metric", "base", treat, f"{treat} − base, paired", "chosen"], rows),
        ]
    if "test" in p:
        test = p["test"]
        lines += [
            "## Test split, Phase D end to end: aligned cell F1\n",
            md_table(["setting", "source", "n", "aligned cell F1"], _per_source_rows(test["phase_d"])),
            "\nSchema F1 of π1's schemas in the same run:\n",
            md_table(["setting", "source", "n", "schema F1"], _per_source_rows(test["schema_f1"])),
        ]
        rows = [
            [
                x["baseline"],
                x["treatment"],
                x["scope"],
                x["n"],
                f"{100 * x['diff']:+.2f} [{100 * x['ci_low']:+.2f}, {100 * x['ci_high']:+.2f}]",
                f"{x['p_value']:.3f}",
            ]
            for x in test["paired"]
        ]
        if rows:
            lines += [
                "\nPaired tests (aligned cell F1):\n",
                md_table(["baseline", "treatment", "scope", "n", "diff", "p"], rows),
            ]
    rep = p["repeat"]
    if rep:
        lines.append(f"## Does an evaluation repeat? π1 on {rep['documents']} validation documents\n")
        rows = []
        for mode, r in rep.items():
            if mode == "documents":
                continue
            if "missing" in r:
                rows.append([mode, "missing: " + ", ".join(r["missing"]), "", "", ""])
                continue
            for run_name, x in r.items():
                if run_name == "repeats":
                    continue
                rows.append([mode, run_name, x["answers"], x["differ_from_first"], f"{x['schema_f1']:.4f}"])
        lines.append(md_table(["mode", "run", "answers", "differ from c256_1", "schema F1"], rows))
    return "\n".join(lines) + "\n"


def plot(p: dict[str, Any], path: Path, combined: Mapping[str, Any] | None = None) -> Path | None:
    """Left: the SFT runs' validation loss. Right: Phase D on test per source or, with ``combined`` (several
    seeds), treatment − sft per source for each seed with its paired 95% interval. The loss is drawn against
    the examples seen (step × batch), so runs of different batch sizes share an axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    treat = p.get("treatment", DEFAULT_TREATMENT)
    curves = {n: (s["val_loss"], s.get("batch", DEFAULT_BATCH)) for n, s in p["sft"].items() if s["val_loss"]}
    test = p.get("test", {}).get("phase_d", {})
    if not curves and not test:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (c, batch) in curves.items():
        a.plot([s * batch for s, _ in c], [v for _, v in c], marker="o", label=f"{name} (batch {batch})")
    seed = f" (seed {p['run'].get('sft_seed') or 0})" if combined else ""
    a.set(xlabel="examples seen (step × batch)", ylabel="validation loss", title=f"SFT: validation loss{seed}")
    if curves:
        a.legend()
    if combined and combined.get("paired"):
        scopes = [t for t in combined["paired"] if t["scope"] != "pooled"]
        for k in range(max(t["seeds"] for t in scopes)):
            xs = [i + 0.2 * k for i in range(len(scopes))]
            d = [100 * t["per_seed"][k]["diff"] for t in scopes]
            err = [
                [100 * (t["per_seed"][k]["diff"] - t["per_seed"][k]["low"]) for t in scopes],
                [100 * (t["per_seed"][k]["high"] - t["per_seed"][k]["diff"]) for t in scopes],
            ]
            b.errorbar(xs, d, yerr=err, fmt="o", capsize=3, label=f"seed {k}")
        b.axhline(0, color="grey", lw=0.8)
        b.set_xticks([i + 0.1 for i in range(len(scopes))], [t["scope"] for t in scopes])
        b.set(ylabel=f"{treat} − sft, aligned cell F1 (points)", title="Test, end to end: paired 95% intervals")
        b.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    sources = sorted({src for s in test.values() for src in s["per_source"]})
    for k, (name, s) in enumerate(test.items()):
        xs = [i + 0.38 * k for i in range(len(sources) + 1)]
        vals = [s["per_source"][src]["mean"] or 0 for src in sources] + [s["macro"] or 0]
        cis = [s["per_source"][src]["ci"] for src in sources] + [s["macro_ci"]]
        err = [
            [v - (c[0] if c else v) for v, c in zip(vals, cis, strict=True)],
            [(c[1] if c else v) - v for v, c in zip(vals, cis, strict=True)],
        ]
        b.bar(xs, vals, width=0.38, yerr=err, capsize=3, label=name)
    b.set_xticks([i + 0.19 for i in range(len(sources) + 1)], [*sources, "macro"])
    b.set(ylabel="aligned cell F1 (test, end to end)", title="Phase D on test, 95% intervals")
    if test:
        b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def combine(seeds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Across SFT seeds: each setting's test numbers averaged over seeds (``phase_d[setting].per_source[src]``)
    and, per scope, treatment − sft of every seed with the mean difference and a conservative 95% interval (the mean
    of the seeds' bounds: the seeds share the test documents, so their errors are not independent, and the
    mean of two estimates has an error at most the mean of theirs)."""
    tested = [p for p in seeds if "test" in p]
    treat = seeds[0].get("treatment", DEFAULT_TREATMENT) if seeds else DEFAULT_TREATMENT
    if any(p.get("treatment", DEFAULT_TREATMENT) != treat for p in seeds):
        raise ValueError(f"the seeds compare different treatments: {sorted({str(p.get('treatment')) for p in seeds})}")
    phase_d: dict[str, Any] = {}
    for setting in ("sft", treat):
        rows = [p["test"]["phase_d"][setting] for p in tested if setting in p["test"]["phase_d"]]
        if len(rows) != len(tested) or not rows:
            continue
        sources = sorted(rows[0]["per_source"])
        phase_d[setting] = {
            "macro": sum(float(r["macro"]) for r in rows) / len(rows),
            "per_source": {s: sum(float(r["per_source"][s]["mean"]) for r in rows) / len(rows) for s in sources},
            "seeds": len(rows),
        }
    paired: list[dict[str, Any]] = []
    scopes = sorted({t["scope"] for p in tested for t in p["test"]["paired"]})
    for scope in scopes:
        per_seed = [
            next((t for t in p["test"]["paired"] if t["scope"] == scope and t["baseline"] == "sft"), None)
            for p in tested
        ]
        if any(t is None for t in per_seed) or not per_seed:
            continue
        ts = [t for t in per_seed if t is not None]
        paired.append(
            {
                "baseline": "sft",
                "treatment": treat,
                "scope": scope,
                "metric": ts[0]["metric"],
                "diff": sum(t["diff"] for t in ts) / len(ts),
                "low": sum(t["ci_low"] for t in ts) / len(ts),
                "high": sum(t["ci_high"] for t in ts) / len(ts),
                "p": max(t["p_value"] for t in ts),
                "seeds": len(ts),
                "per_seed": [
                    {"diff": t["diff"], "low": t["ci_low"], "high": t["ci_high"], "p": t["p_value"]} for t in ts
                ],
            }
        )
    out: dict[str, Any] = {"treatment": treat, "phase_d": phase_d, "paired": paired}
    if tested and all({"sft", treat} <= set(p.get("test_rows", {})) for p in tested):
        out["pooled_over_seeds"] = pooled_over_seeds(tested)
    return out


def pooled_over_seeds(seeds: Sequence[Mapping[str, Any]], golden: Path | None = None) -> list[dict[str, Any]]:
    """treatment − sft with every document's metric averaged over the seeds first, then paired-tested (macro, pooled and
    per source): the seeds' test rows (``test_rows_<setting>.jsonl.gz``) scored against the golden test split."""
    import gzip

    from bench.common import golden_dir
    from shared import read_golden
    from trainer.evaluation.phase_d import DEFAULT_PAIRED_METRIC, normalize_prediction_record, score_predictions
    from trainer.evaluation.significance import mean_over_seeds, paired_tests

    examples = read_golden(golden_dir(golden) / "common_test_schemas.jsonl")
    treat = seeds[0].get("treatment", DEFAULT_TREATMENT)
    rows: dict[str, list[dict[str, Any]]] = {}
    for setting in ("sft", treat):
        per_seed = []
        for p in seeds:
            with gzip.open(p["test_rows"][setting], "rt") as f:
                recs = [normalize_prediction_record(json.loads(line)) for line in f if line.strip()]
            per_seed.append(score_predictions(examples, recs))
        rows[setting] = mean_over_seeds(per_seed, DEFAULT_PAIRED_METRIC)
    return paired_tests(rows, [("sft", treat)], DEFAULT_PAIRED_METRIC)


def render_combined(c: Mapping[str, Any], seeds: Sequence[Mapping[str, Any]], command: str) -> str:
    treat = c.get("treatment", DEFAULT_TREATMENT)
    title = "SFT source mix" if treat == DEFAULT_TREATMENT else f"SFT recipes, {treat} against base"
    lines = [
        f"# {title}, over SFT seeds: chosen on validation, compared on test\n",
        f"- this report: `{command}`; each seed's full report follows the summary",
        "- seeds: "
        + "; ".join(
            f"seed {p['run'].get('sft_seed') or 0} (`{p['run'].get('commit')}`): π1 "
            f"{p['choice']['pi1']['chosen']}, π2 {p['choice']['pi2']['chosen']}"
            for p in seeds
            if p.get("choice")
        ),
        f"- {treat} − sft on the test split, end to end, aligned cell F1 (points); the interval over seeds is the "
        "mean of the seeds' paired 95% bounds (conservative: the seeds share the documents); p is the largest seed's\n",
    ]
    rows = []
    for t in c["paired"]:
        each = ", ".join(
            f"{100 * x['diff']:+.2f} [{100 * x['low']:+.2f}, {100 * x['high']:+.2f}]" for x in t["per_seed"]
        )
        rows.append(
            [
                t["scope"],
                each,
                f"{100 * t['diff']:+.2f} [{100 * t['low']:+.2f}, {100 * t['high']:+.2f}]",
                f"{t['p']:.3f}",
            ]
        )
    lines.append(md_table(["scope", "each seed", "over seeds", "p (max)"], rows))
    pooled = c.get("pooled_over_seeds")
    if pooled:
        rows = [
            [
                t["scope"],
                t["n"],
                f"{100 * t['diff']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]",
                f"{t['p_value']:.3f}",
            ]
            for t in pooled
        ]
        lines += [
            "\nPaired over seeds (each document's metric averaged over the seeds, then bootstrapped):\n",
            md_table(["scope", "n", f"{treat} − sft", "p"], rows),
        ]
    pd = c["phase_d"]
    if pd:
        sources = sorted(next(iter(pd.values()))["per_source"])
        rows = [
            [name, *(f"{100 * s['per_source'][src]:.2f}" for src in sources), f"{100 * s['macro']:.2f}"]
            for name, s in pd.items()
        ]
        lines += [
            "\nMeans over seeds (test, end to end, aligned cell F1 ×100):\n",
            md_table(["setting", *sources, "macro"], rows),
        ]
    return "\n".join(lines) + "\n"


def run(
    collected: Sequence[Path], notes_file: Path | None = None, name: str = NAME, repeat: Path | None = None
) -> dict[str, Any]:
    """One report of one node run or, with several ``collected`` (one per SFT seed), the seeds combined;
    ``repeat``: a repeat_check.sh folder whose settings join the repeat table."""
    import sys

    command = "python -m bench " + " ".join(sys.argv[1:])
    seeds = [build(c) for c in collected]
    if repeat is not None:
        seeds[0]["repeat_check"] = repeat_summary(repeat) | {"run": _read(repeat / "run_info.json")}
    if len(seeds) == 1:
        p, md = seeds[0], render_md(seeds[0], command)
    else:
        p = {"seeds": seeds, **combine(seeds)}
        md = render_combined(p, seeds, command)
        md += "\n".join(
            "\n---\n\n" + render_md(s, command).replace("\n## ", "\n### ").replace("# SFT", "## SFT", 1) for s in seeds
        )
    rc = seeds[0].get("repeat_check")
    if rc:
        rows = []
        for mode, r in rc.items():
            if mode in ("documents", "run") or "missing" in r:
                continue
            rows += [[mode, run_name, x["differ_from_first"]] for run_name, x in r.items() if run_name != "repeats"]
        info = rc["run"]
        md += (
            f"\n## Does an evaluation repeat? Executor settings, {rc['documents']} {info['repeat_source']} validation "
            f"documents, model `{info['model']}`, max tokens {info['max_tokens']} (`{info['command']}` at "
            f"`{info['commit']}`)\n\n" + md_table(["setting", "run", "answers that differ from c256_1"], rows)
        )
    if notes_file is not None:
        md += "\n" + notes_file.read_text()
    write_result(name, p, md, quick=False)
    plot(seeds[0], RESULTS_DIR / f"{name}.png", p if len(seeds) > 1 else None)
    return p

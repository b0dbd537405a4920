"""The SFT source mix, chosen on validation and compared on test; and whether an evaluation repeats exactly.

``scripts/gpu_node/sft_mix.sh`` runs on a GPU node: A1 and A2 each trained once on the golden train split
(``base``) and once on it reweighted by source (``mix``, ``trainer data build --sft-mix``), the same number of
examples; each model then scored on the validation split; ``python -m bench sft-mix choose ROOT`` picks per
policy; Phase D runs on the test split for sft (both ``base``) and the chosen pair. Then, here,
``python -m bench sft-mix report --collected DIR`` reads the unpacked ``job.sh collect`` archive and writes
``bench/results/sft_mix.{json,md,png}``.

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
VARIANTS = ("base", "mix")
# what each policy is chosen by on validation, and the folder its two variants were scored into
CHOICE_METRIC = {"pi1": ("schema_f1", "val_pi1"), "pi2": ("aligned_cell_f1", "val_pi2")}
SFT_RUNS = ("a1_base", "a1_mix", "a2_base", "a2_mix")
REPEAT_MODES = ("default", "batch_invariant")
REPEAT_RUNS = ("c256_1", "c256_2", "c32")  # sft_mix.sh's runs; repeat_check.sh runs c16 as its third


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def macro_paired(tests: Sequence[Mapping[str, Any]], base: str, treat: str) -> dict[str, Any] | None:
    for t in tests:
        if t.get("scope") == "macro" and t["baseline"] == base and t["treatment"] == treat:
            return dict(t)
    return None


def choose(root: Path) -> dict[str, Any]:
    """Per policy, ``base`` or ``mix`` by its validation metric's macro mean; written to ``ROOT/choice.json``."""
    out: dict[str, Any] = {}
    for policy, (metric, folder) in CHOICE_METRIC.items():
        path = root / folder / "metrics.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the validation scores of {policy}'s two variants are missing")
        m = _read(path)
        means = {}
        for v in VARIANTS:
            value = m["settings"].get(v, {}).get("macro", {}).get(metric)
            if value is None or not math.isfinite(float(value)):
                raise ValueError(f"{path}: setting {v!r} has no macro {metric}")
            means[v] = float(value)
        chosen = "mix" if means["mix"] > means["base"] else "base"
        out[policy] = {
            "metric": metric,
            "split": "validation",
            "macro": means,
            "chosen": chosen,
            "paired": macro_paired(m.get("paired_tests", []), "base", "mix"),
        }
    (root / "choice.json").write_text(json.dumps(out, indent=2) + "\n")
    for policy, c in out.items():
        print(f"{policy}: {c['chosen']} ({c['metric']} macro on validation: base {c['macro']['base']:.4f}, "
              f"mix {c['macro']['mix']:.4f})")  # fmt: skip
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
    # the node script's folder (MIX_OUT, packed by `job.sh collect` under its own name), or the archive itself
    roots = sorted(d for d in collected.iterdir() if (d / "run_info.json").is_file()) if collected.is_dir() else []
    root = roots[0] if len(roots) == 1 else collected
    info = _read(root / "run_info.json") if (root / "run_info.json").is_file() else {}
    seconds = stage_seconds(collected)
    manifest = root / "data_mix_manifest.json"
    mix = _read(manifest)["phases"]["a1"].get("sft_mix") if manifest.is_file() else None
    sft = {}
    for name in SFT_RUNS:
        result = root / name / "phase_result.json"
        r = _read(result) if result.is_file() else {}
        sft[name] = {
            "status": r.get("status"),
            "steps": r.get("best_step"),
            "phase_seconds": r.get("seconds"),
            "job_seconds": seconds.get(name),
            "val_loss": val_loss_curve(root / name / "metrics.jsonl"),
        }
    p: dict[str, Any] = {
        "run": info,
        "card": (collected / "card.txt").read_text().strip() if (collected / "card.txt").is_file() else None,
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
    lines = [
        "# SFT source mix: chosen on validation, compared on test; evaluations that repeat\n",
        f"- card: {p['card']}",
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- on the node: `{run.get('command')}` at `{run.get('commit')}`, SFT_MIX `{run.get('sft_mix')}`, "
        f"val loss every {run.get('sft_test_freq')} steps, max tokens {run.get('max_tokens')}",
        f"- this report: `{command}`",
        "- numbers are points (×100) with 95% bootstrap intervals; paired tests are mix − base (or mix − sft) over "
        "the same documents\n",
    ]
    if p["sft_mix"]:
        m = p["sft_mix"]
        rows = [[s, m["train_before"].get(s, 0), m["train_after"].get(s, 0), m["weights"].get(s, 1.0)]
                for s in sorted(m["train_before"])]  # fmt: skip
        lines += ["## The train split per source\n", md_table(["source", "base", "mix", "weight"], rows)]
    rows = []
    for name, s in p["sft"].items():
        curve = ", ".join(f"{step}: {loss:.4f}" for step, loss in s["val_loss"])
        rows.append([name, s["status"], s["steps"], s["phase_seconds"], s["job_seconds"], curve or "–"])
    lines += ["## SFT runs (one GPU each), and the validation loss by step\n",
              md_table(["run", "status", "steps", "phase s", "job s", "val loss (step: loss)"], rows)]  # fmt: skip
    for policy, val in p["validation"].items():
        title = "π1: schema F1 of its schemas" if policy == "pi1" else "π2: aligned cell F1 on the gold schemas"
        lines += [f"## Validation, {title}\n",
                  md_table(["variant", "source", "n", val["metric"]], _per_source_rows(val["settings"]))]  # fmt: skip
    if p["choice"]:
        rows = []
        for policy, c in p["choice"].items():
            t = c.get("paired") or {}
            diff = f"{100 * t['diff']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]" if t else "–"
            rows.append([policy, c["metric"], _pt(c["macro"]["base"]), _pt(c["macro"]["mix"]), diff, c["chosen"]])
        lines += ["## The choice (validation, macro mean over sources)\n",
                  md_table(["policy", "metric", "base", "mix", "mix − base, paired", "chosen"], rows)]  # fmt: skip
    if "test" in p:
        t = p["test"]
        lines += ["## Test split, Phase D end to end: aligned cell F1\n",
                  md_table(["setting", "source", "n", "aligned cell F1"], _per_source_rows(t["phase_d"])),
                  "\nSchema F1 of π1's schemas in the same run:\n",
                  md_table(["setting", "source", "n", "schema F1"], _per_source_rows(t["schema_f1"]))]  # fmt: skip
        rows = [[x["baseline"], x["treatment"], x["scope"], x["n"],
                 f"{100 * x['diff']:+.2f} [{100 * x['ci_low']:+.2f}, {100 * x['ci_high']:+.2f}]", f"{x['p_value']:.3f}"]
                for x in t["paired"]]  # fmt: skip
        if rows:
            lines += ["\nPaired tests (aligned cell F1):\n",
                      md_table(["baseline", "treatment", "scope", "n", "diff", "p"], rows)]  # fmt: skip
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


def plot(p: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {n: s["val_loss"] for n, s in p["sft"].items() if s["val_loss"]}
    test = p.get("test", {}).get("phase_d", {})
    if not curves and not test:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        a.plot([s for s, _ in c], [v for _, v in c], marker="o", label=name)
    a.set(xlabel="SFT step", ylabel="validation loss", title="SFT: validation loss")
    a.legend()
    sources = sorted({src for s in test.values() for src in s["per_source"]})
    for k, (name, s) in enumerate(test.items()):
        xs = [i + 0.38 * k for i in range(len(sources) + 1)]
        vals = [s["per_source"][src]["mean"] or 0 for src in sources] + [s["macro"] or 0]
        cis = [s["per_source"][src]["ci"] for src in sources] + [s["macro_ci"]]
        err = [[v - (c[0] if c else v) for v, c in zip(vals, cis, strict=True)],
               [(c[1] if c else v) - v for v, c in zip(vals, cis, strict=True)]]  # fmt: skip
        b.bar(xs, vals, width=0.38, yerr=err, capsize=3, label=name)
    b.set_xticks([i + 0.19 for i in range(len(sources) + 1)], [*sources, "macro"])
    b.set(ylabel="aligned cell F1 (test, end to end)", title="Phase D on test, 95% intervals")
    if test:
        b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(collected: Path, notes_file: Path | None = None, name: str = NAME) -> dict[str, Any]:
    import sys

    p = build(collected)
    command = "python -m bench " + " ".join(sys.argv[1:])
    md = render_md(p, command)
    if notes_file is not None:
        md += "\n" + notes_file.read_text()
    write_result(name, p, md, quick=False)
    plot(p, RESULTS_DIR / f"{name}.png")
    return p

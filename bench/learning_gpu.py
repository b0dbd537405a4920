"""The learning run's report (issue 12) from what a GPU node brought back: ``bench/results/learning_gpu.*``.

    python -m bench.learning_gpu --collected DIR --run-info FILE [--partial "base and sft only"]

``DIR`` is the unpacked ``learn.tar.gz`` of ``bench/gpu/learning.sh collect`` (``phase_d/metrics.json``,
``stages.tsv``, ``a1_phase_result.json`` …); ``FILE`` a JSON object with ``card``, ``gpus``,
``versions`` and ``commands`` (what ran, written down by whoever ran it). The JSON keeps the layout
issue 12 asks for: ``phase_d[setting].overall[metric]``, ``phase_d[setting].per_source[src][metric]``,
``stages[name].seconds``, ``gpus``, ``card``, ``test_documents``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, md_table

NAME = "learning_gpu"
# The plain Hugging Face SFT baseline of issue 12 (one epoch per stage, lr 1e-4 linear decay, batch 32,
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
KEYS = tuple(HF_BASELINE)


def read_stages(path: Path) -> dict[str, dict[str, float]]:
    """``stages.tsv`` lines (name, start, end, seconds); a stage run twice keeps its last run."""
    out: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            name, start, end, seconds = parts
            out[name] = {"start": float(start), "end": float(end), "seconds": float(seconds)}
    return out


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


def build(collected: Path, run_info: dict[str, Any], partial: str | None) -> dict[str, Any]:
    metrics = json.loads((collected / "phase_d" / "metrics.json").read_text())
    settings: dict[str, Any] = metrics["settings"]
    stages = read_stages(collected / "stages.tsv") if (collected / "stages.tsv").is_file() else {}
    phases = {}
    for ph in ("a1", "a2"):
        f = collected / f"{ph}_phase_result.json"
        if f.is_file():
            phases[ph] = json.loads(f.read_text())
    n_docs = {name: s["overall"].get("n") for name, s in settings.items()}
    payload: dict[str, Any] = {
        "benchmark": NAME,
        "partial": partial,
        "card": run_info.get("card"),
        "gpus": run_info.get("gpus"),
        "versions": run_info.get("versions", {}),
        "commands": run_info.get("commands", []),
        "notes": run_info.get("notes", []),
        "test_documents": max((v for v in n_docs.values() if v), default=0),
        "phase_d": {name: {"overall": s["overall"], "per_source": s["per_source"]} for name, s in settings.items()},
        "stages": stages,
        "sft_phases": phases,
        "hf_baseline": {"metrics": HF_BASELINE, "seconds": HF_BASELINE_SECONDS},
        "sft_vs_hf_baseline": compare_with_baseline(settings["sft"]["overall"]) if "sft" in settings else [],
        "loop2": metrics.get("loop2"),
    }
    return payload


def render_md(p: dict[str, Any]) -> str:
    title = "Learning on GPUs: SFT at full scale and Phase D on the whole test split"
    md = f"# {title}" + (f" (partial run: {p['partial']})" if p.get("partial") else "") + "\n\n"
    md += f"- card: {p['card']} × {p['gpus']}\n"
    md += "- versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items()) + "\n"
    md += f"- test documents: {p['test_documents']}\n\n"
    names = list(p["phase_d"])
    md += "## Phase D, end to end (greedy)\n\n" + md_table(
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
        md += "\n## sft against the plain Hugging Face SFT baseline (issue 12)\n\n" + md_table(
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
    if p["stages"]:
        md += "\n## Wall time of every stage\n\n" + md_table(
            ["stage", "seconds"], [[k, v["seconds"]] for k, v in p["stages"].items()]
        )
        hf = HF_BASELINE_SECONDS
        md += f"\nHF baseline SFT: {hf['sft_a1']:.0f} s (π1), {hf['sft_a2']:.0f} s (π2).\n"
    if p["commands"]:
        md += "\n## Commands\n\n" + "\n".join(f"- `{c}`" for c in p["commands"]) + "\n"
    if p["notes"]:
        md += "\n## Notes\n\n" + "\n".join(f"- {n}" for n in p["notes"]) + "\n"
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collected", type=Path, required=True)
    ap.add_argument("--run-info", type=Path, required=True)
    ap.add_argument("--partial", default=None, help="Say what the run left out (marks the report partial).")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = ap.parse_args(argv)
    payload = build(a.collected, json.loads(a.run_info.read_text()), a.partial)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{NAME}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (a.out_dir / f"{NAME}.md").write_text(render_md(payload))
    print(f"wrote {a.out_dir / NAME}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

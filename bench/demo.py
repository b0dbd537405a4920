"""``python -m bench demo --collected DEMO_OUT``: a finished ``make demo`` as the result file
``bench/results/demo.{json,md,png}``: the machine, versions and commit, the demo's command and settings, every part's
time, per setting and per source the metrics with their 95% intervals, the paired tests, C1's reward per step (the
plot copied) and the demo's line on what it can show. Read from the demo's own outputs (the run record
``run.json``, ``metrics.json``, ``reward_curve.png``), never retyped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, header_md, md_table, run_record, write_result

NAME = "demo"
METRICS = ("schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")


def collect(folder: Path, demo_command: str) -> dict[str, Any]:
    """The result's JSON: what the demo in ``folder`` recorded, and how it was run."""
    summary = json.loads((folder / "run.json").read_text())
    metrics = json.loads((folder / "metrics.json").read_text())
    settings = list(metrics["settings"])
    return {
        "run": run_record(quick=False),
        "demo_command": demo_command,
        "documents": summary["documents"],
        "part_seconds": {name: part["seconds"] for name, part in summary["parts"].items()},
        "total_seconds": summary["total_seconds"],
        "sft_settings": summary["sft_settings"],
        "rl_settings": summary["rl_settings"],
        "targets": summary["targets"],
        "settings": {
            name: {
                "overall": {k: metrics["settings"][name]["overall"].get(k) for k in METRICS},
                "per_source": {
                    src: {k: vals.get(k) for k in METRICS}
                    for src, vals in metrics["settings"][name].get("per_source", {}).items()
                },
                "ci95": metrics["settings"][name]["ci95"],
            }
            for name in settings
        },
        "paired_tests": metrics.get("paired_tests", []),
        "rl": {k: summary["rl"][k] for k in ("curve", "sft_to_pipe", "verdict")},
    }


def markdown(payload: dict[str, Any]) -> str:
    run, settings = payload["run"], payload["settings"]
    rl_cfg, sft_cfg = payload["rl_settings"], payload["sft_settings"]
    out = header_md("The demo (`make demo`): base → SFT → C1 GRPO on the pipeline reward", run)
    out += (
        f"- demo command: `{payload['demo_command']}`; {payload['documents']} held-out documents of the bundled "
        f"E2E sample\n- SFT: {sft_cfg['steps']} steps × {sft_cfg['batch']} examples, lr {sft_cfg['lr']:g}; C1: "
        f"{rl_cfg['steps']} steps × {rl_cfg['prompts']} prompts × {rl_cfg['samples']} samples, lr {rl_cfg['lr']:g}\n\n"
    )
    out += "## Time of each part (s)\n\n" + md_table(
        ["part", "seconds"], [*payload["part_seconds"].items(), ("total", payload["total_seconds"])]
    )
    rows = []
    for name, s in settings.items():
        ci = s["ci95"]["overall"]
        rows.append([name, *(fmt_ci(s["overall"].get(k), ci.get(k)) for k in METRICS)])
        for src, vals in s["per_source"].items():
            src_ci = s["ci95"]["per_source"].get(src, {})
            rows.append([f"{name}, {src}", *(fmt_ci(vals.get(k), src_ci.get(k)) for k in METRICS)])
    out += "\n## Held-out documents, pooled and per source (95% interval)\n\n" + md_table(["setting", *METRICS], rows)
    tests = [t for t in payload["paired_tests"] if t.get("scope") == "pooled"]
    paired_rows = [
        [
            f"{t['baseline']} → {t['treatment']}",
            t["metric"],
            t["n"],
            f"{100 * t['diff']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]",
            f"{t['p_value']:.3f}",
        ]
        for t in tests
    ]
    headers = ["baseline → treatment", "metric", "n", "diff [95% interval]", "p"]
    out += "\n## Paired tests (pooled; points)\n\n" + md_table(headers, paired_rows)
    targets = ", ".join(f"{k} ≥ {t['min']} ({t['sft']:.3f}: {'met' if t['met'] else 'NOT met'})"
                        for k, t in payload["targets"].items())  # fmt: skip
    out += f"\nsft targets: {targets}\n\n## C1\n\n{payload['rl']['verdict']}\n\n![C1's reward per step](demo.png)\n"
    return out


def fmt_ci(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def run(folder: Path, demo_command: str) -> dict[str, Any]:
    payload = collect(folder, demo_command)
    write_result(NAME, payload, markdown(payload), quick=False)
    shutil.copyfile(folder / "reward_curve.png", RESULTS_DIR / f"{NAME}.png")
    return payload

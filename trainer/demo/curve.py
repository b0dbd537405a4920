"""What the demo's C1 phase shows: its reward per step (from VERL's ``metrics.jsonl``), the plot of it, and one
plain line on what a few CPU steps can and cannot show, from the paired test sft → pipe on the held-out documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.demo.settings import RlSettings

TRAIN_MEAN, TRAIN_MIN, TRAIN_MAX = "critic/score/mean", "critic/score/min", "critic/score/max"
# mask mode's counts of a step (trainer/phase_rules/failure_mask.py): masked samples, in all and per cause
MASKED = "training/masked/samples"
_MASKED_CAUSE = re.compile(r"^training/masked/(?P<cause>[a-z_]+)$")
_NOT_CAUSES = {"samples", "share", "dropped_groups", "no_gradient"}
# the greedy validation reward of each data source (VERL's val_kwargs: do_sample false, n 1)
_VAL = re.compile(r"^val-core/(?P<ds>[^/]+)/reward/mean@1$")


def reward_curve(metrics_jsonl: Path) -> dict[str, list[dict[str, float]]]:
    """``train``: per step the mean (min, max) reward of its samples, and the samples mask mode took out of it
    (``masked``, and ``masked/<cause>`` for each cause that occurred; a masked sample's score 0 is in VERL's mean);
    ``validation``: per validated step the greedy reward, averaged over the data sources. Empty lists when the file
    is missing (nothing was logged)."""
    train: list[dict[str, float]] = []
    val: list[dict[str, float]] = []
    lines = metrics_jsonl.read_text().splitlines() if metrics_jsonl.is_file() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        data, step = row.get("data") or {}, int(row.get("step", 0))
        if isinstance(data.get(TRAIN_MEAN), int | float):
            point = {"step": step, "mean": float(data[TRAIN_MEAN])}
            point |= {k: float(data[key]) for k, key in (("min", TRAIN_MIN), ("max", TRAIN_MAX)) if key in data}
            if isinstance(data.get(MASKED), int | float):
                point["masked"] = float(data[MASKED])
                for key, value in data.items():
                    m = _MASKED_CAUSE.match(key)
                    if m and m["cause"] not in _NOT_CAUSES and isinstance(value, int | float) and value:
                        point[f"masked/{m['cause']}"] = float(value)
            train.append(point)
        greedy = [float(v) for k, v in data.items() if _VAL.match(k) and isinstance(v, int | float)]
        if greedy:
            val.append({"step": step, "reward": sum(greedy) / len(greedy)})
    return {"train": train, "validation": val}


def plot_reward_curve(curve: Mapping[str, Sequence[Mapping[str, float]]], png: Path, rl: RlSettings) -> Path:
    """The training reward per step (the band: its samples' min to max) and the greedy validation reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    train, val = curve["train"], curve["validation"]
    if train:
        steps = [p["step"] for p in train]
        ax.plot(steps, [p["mean"] for p in train], marker="o", label="training samples: mean reward")
        if all("min" in p and "max" in p for p in train):
            ax.fill_between(steps, [p["min"] for p in train], [p["max"] for p in train], alpha=0.15, label="min–max")
    if val:
        ax.plot([p["step"] for p in val], [p["reward"] for p in val], marker="s", linestyle="--",
                label="validation: greedy reward")  # fmt: skip
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("pipeline reward")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lowest = min([p.get("min", p["mean"]) for p in train] + [p["reward"] for p in val] + [0.0])
    ax.set_ylim(max(-1.05, lowest - 0.1), 1.05)
    ax.set_title(f"C1 on CPU: {rl.steps} steps × {rl.prompts} prompts × {rl.samples} samples", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def paired(tests: Sequence[Mapping[str, Any]], baseline: str, treatment: str) -> dict[str, Any] | None:
    """The pooled paired test ``baseline`` → ``treatment`` of a Phase D's ``paired_tests``, if it has one."""
    for t in tests:
        if t.get("baseline") == baseline and t.get("treatment") == treatment and t.get("scope") == "pooled":
            return dict(t)
    return None


def what_it_shows(test: Mapping[str, Any] | None, rl: RlSettings) -> str:
    """One honest line: the change sft → pipe with its interval, and that a few CPU steps show the loop run, not
    learning (unless the interval says otherwise)."""
    samples = rl.steps * rl.prompts * rl.samples
    head = f"C1 ran {rl.steps} GRPO step{'s' if rl.steps != 1 else ''} on {samples} sampled schemas"
    if test is None:
        return f"{head}; no paired test sft → pipe (no document scored by both)."
    diff, lo, hi = (100 * float(test[k]) for k in ("diff", "ci_low", "ci_high"))
    change = f"pipe − sft {test['metric']}: {diff:+.2f} points [{lo:+.2f}, {hi:+.2f}] over {test['n']} documents"
    if lo > 0:
        meaning = (
            "above sft beyond its interval on these documents; one short run of one seed, so a sign that the "
            "pipeline reward moves the policy, not a measured gain"
        )
    elif hi < 0:
        meaning = "below sft beyond its interval on these documents (one short run of one seed)"
    else:
        meaning = "within the noise: this shows the pipeline-reward loop running end to end, not learning"
    return (
        f"{head}; {change}, {meaning}. Learning needs GPU-sized runs (bench/results/learning.md has the measured "
        "numbers, per source and with intervals)."
    )


def markdown_section(curve: Mapping[str, Sequence[Mapping[str, float]]], png: Path, verdict: str) -> str:
    """The C1 section of the demo's report.md: the line, the plot, the rewards per step and the samples masked."""
    val = {int(p["step"]): f"{p['reward']:.3f}" for p in curve["validation"]}
    train = {int(p["step"]): f"{p['mean']:.3f}" for p in curve["train"]}
    masked = {int(p["step"]): _masked_cell(p) for p in curve["train"]}
    rows = [
        f"| {step} | {train.get(step, '–')} | {masked.get(step, '–')} | {val.get(step, '–')} |"
        for step in sorted({*val, *train})
    ]
    return "\n".join(
        [
            "## C1: GRPO on the pipeline reward",
            "",
            verdict,
            "",
            f"![C1's reward per step]({png.name})",
            "",
            "| step | training samples: mean reward | masked (no gradient): cause | validation: greedy reward |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _masked_cell(point: Mapping[str, float]) -> str:
    """``0``, ``2 (executor_truncated 2)``, or ``–`` for a step logged without mask mode's counts."""
    if "masked" not in point:
        return "–"
    causes = [f"{k.split('/', 1)[1]} {v:g}" for k, v in point.items() if k.startswith("masked/")]
    return f"{point['masked']:g}" + (f" ({', '.join(causes)})" if causes else "")

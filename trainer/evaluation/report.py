"""Phase-D rendering: the Markdown report, the plots and the console summary of one evaluation.

Pure presentation of the metrics that :mod:`trainer.evaluation.phase_d` computed (no model, no scoring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shared import PROMPT_VERSION, AlignedMetrics

SCHEMA_METRICS = ("schema_valid", "schema_precision", "schema_recall", "schema_f1")


def aligned_key(name: str) -> str:
    """Report key of an aligned metric: one ``aligned_`` prefix (``aligned_cell_accuracy`` keeps its name)."""
    return name if name.startswith("aligned_") else f"aligned_{name}"


TABLE_METRICS = ("table_valid", "cell_accuracy", *(aligned_key(k) for k in AlignedMetrics.__dataclass_fields__))
SUMMARY_KEYS = ("n", "schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("–" if v is None else str(v))


def markdown_report(
    metrics: Mapping[str, Mapping[str, Any]],
    decision: Mapping[str, Any],
    title: str,
    paired_tests: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = None,
    serving: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    names = list(metrics)
    keys = ["n", *SCHEMA_METRICS, *TABLE_METRICS]
    keys = [k for k in keys if any(k in metrics[n]["overall"] for n in names)]
    lines = [f"# {title}", "", f"Prompt version: `{PROMPT_VERSION}`", ""]
    if max_tokens is not None:
        lines += [f"Max tokens per answer: {max_tokens}", ""]
    if serving:
        lines += [serving_line(serving), ""]
    lines += _truncation_lines(metrics, names)
    lines += _refusal_lines(metrics, names)
    if all("macro" in metrics[n] for n in names):
        n_src = max(int(metrics[n]["macro"].get("n", 0)) for n in names)
        lines += [f"## Macro mean over {n_src} sources (the headline: every source weighs the same)", ""]
        lines += ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [
            f"| {k} | " + " | ".join(_fmt(metrics[n]["macro"].get(k)) for n in names) + " |" for k in keys if k != "n"
        ]
        lines += [""]
    lines += ["## Pooled over documents", ""]
    lines += ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {k} | " + " | ".join(_fmt(metrics[n]["overall"].get(k)) for n in names) + " |" for k in keys]
    sources = sorted({s for n in names for s in metrics[n]["per_source"]})
    for key in ("schema_f1", "cell_accuracy", "aligned_cell_f1"):
        if not any(key in metrics[n]["overall"] for n in names):
            continue
        lines += ["", f"## {key} per data source", "", "| source | n | " + " | ".join(names) + " |"]
        lines += ["|---|---|" + "---|" * len(names)]
        for s in sources:
            n_s = next((metrics[n]["per_source"][s]["n"] for n in names if s in metrics[n]["per_source"]), 0)
            vals = [_fmt(metrics[n]["per_source"].get(s, {}).get(key)) for n in names]
            lines.append(f"| {s} | {n_s} | " + " | ".join(vals) + " |")
    lines += _interval_lines(metrics, names, keys)
    lines += _paired_lines(paired_tests or [])
    lines += ["", "## Loop-2 decision", "", f"**{decision['decision']}**: {decision.get('reason', '')}", ""]
    return "\n".join(lines)


def _serving_text(rec: Mapping[str, Any]) -> str:
    def flag(key: str, what: str, on: str, off: str) -> str:
        value = rec.get(key)
        return on if value is True else off if value is False else f"{what} unknown"

    build = rec.get("vllm_build", "unknown")
    return ", ".join(
        (
            "vLLM build unknown" if build == "unknown" else f"vLLM {build}",
            flag("eager", "eager", "eager", "CUDA graphs"),
            flag("prefix_caching", "prefix caching", "prefix caching on", "no prefix caching"),
            flag("batch_invariant", "batch-invariant mode", "batch-invariant mode on", "batch-invariant mode off"),
            f"concurrency {rec.get('concurrency', 'unknown')}",
            f"max tokens {rec.get('max_tokens', 'unknown')}",
        )
    )


def serving_line(serving: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: how the answers were generated (one mode for every setting, or each setting's)."""
    texts = {name: _serving_text(rec) for name, rec in serving.items()}
    if len(set(texts.values())) == 1:
        return f"Serving: {next(iter(texts.values()))} (every setting)."
    return "Serving: " + "; ".join(f"{name}: {text}" for name, text in texts.items()) + "."


def _truncation_lines(metrics: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """Answers cut at the token limit, per setting and stage (only where the finish reasons were recorded)."""
    rows = [(n, stage, t) for n in names for stage, t in (metrics[n].get("truncated") or {}).items()]
    if not rows:
        return []
    lines = ["## Answers cut at the token limit", "", "| setting | stage | cut | of | share |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {stage} | {t['cut']} | {t['answers']} | {t['share']:.1%} |" for n, stage, t in rows]
    return [*lines, ""]


def _refusal_lines(metrics: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """Prompts the executor refused (HTTP 400), per setting and stage, with the first documents' ids."""
    rows = [(n, stage, r) for n in names for stage, r in (metrics[n].get("refused") or {}).items() if r["refused"]]
    if not rows:
        return []
    lines = ["## Prompts the executor refused (scored as wrong)", "",
             "| setting | stage | refused | of | share | documents |", "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {n} | {stage} | {r['refused']} | {r['answers']} | {r['share']:.1%} | {', '.join(r['ids'])} |"
        for n, stage, r in rows
    ]
    return [*lines, ""]


def _interval_lines(metrics: Mapping[str, Mapping[str, Any]], names: Sequence[str], keys: Sequence[str]) -> list[str]:
    if not any("ci95" in metrics[n] for n in names):
        return []
    lines = ["", "## 95% bootstrap intervals (documents resampled; macro: within each source)", ""]
    lines += ["| metric | scope | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    per_source = {s for n in names for s in metrics[n].get("ci95", {}).get("per_source", {})}
    scopes = ["macro", "overall", *sorted(per_source)]
    for k in keys:
        for scope in scopes:
            cells = []
            for n in names:
                ci95 = metrics[n].get("ci95", {})
                ci = ci95.get(scope) if scope in ("macro", "overall") else ci95.get("per_source", {}).get(scope, {})
                ci = (ci or {}).get(k)
                cells.append(f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "–")
            if any(c != "–" for c in cells):
                label = "pooled" if scope == "overall" else scope
                lines.append(f"| {k} | {label} | " + " | ".join(cells) + " |")
    return lines


def _paired_lines(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    if not tests:
        return []
    lines = ["", "## Paired bootstrap tests (same documents, treatment − baseline)", ""]
    lines += ["| metric | baseline → treatment | scope | n | diff (points) | 95% interval (points) | p |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for t in tests:
        lines.append(
            f"| {t['metric']} | {t['baseline']} → {t['treatment']} | {t.get('scope', 'pooled')} | {t['n']} | "
            f"{100 * t['diff']:+.2f} | [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}] | {t['p_value']:.3f} |"
        )
    return lines


def plot_metrics(metrics: Mapping[str, Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Grouped bars: overall metrics per setting, and cell accuracy per data source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(metrics)
    written: list[Path] = []
    panels: list[tuple[str, list[str], Callable[[str, str], Any]]] = [
        (
            "overall.png",
            [
                k
                for k in ("schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")
                if any(k in metrics[n]["overall"] for n in names)
            ],
            lambda n, k: metrics[n]["overall"].get(k),
        ),
    ]
    sources = sorted({s for n in names for s in metrics[n]["per_source"]})
    key = "cell_accuracy" if any("cell_accuracy" in metrics[n]["overall"] for n in names) else "schema_f1"
    panels.append((f"per_source_{key}.png", sources, lambda n, s: metrics[n]["per_source"].get(s, {}).get(key)))
    for fname, groups, value in panels:
        if not groups:
            continue
        fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups) * max(1, len(names)) / 2), 3.5))
        width = 0.8 / max(1, len(names))
        for j, n in enumerate(names):
            xs = [i + j * width for i in range(len(groups))]
            ax.bar(xs, [float(value(n, g) or 0.0) for g in groups], width, label=n)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=20, ha="right")
        ax.set_ylim(0, 1)
        ax.set_title(fname.removesuffix(".png").replace("_", " "))
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def print_summary(
    console: Console,
    metrics: Mapping[str, Mapping[str, Any]],
    decision: Mapping[str, Any],
    report: Path,
    metrics_path: Path,
) -> None:
    """The overall table, the loop-2 decision and where the report and metrics were written."""
    names = list(metrics)
    table = Table("metric", *names, title="overall")
    for k in SUMMARY_KEYS:
        vals = [metrics[n]["overall"].get(k) for n in names]
        if any(v is not None for v in vals):
            table.add_row(k, *(_fmt(v) for v in vals))
    console.print(table)
    console.print(f"loop-2 decision: [bold]{decision['decision']}[/bold] ({decision.get('reason', '')})")
    console.print(f"report: {report}\nmetrics: {metrics_path}")

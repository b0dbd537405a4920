"""``python -m shared``: validate golden folders and show the metrics on real examples."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from shared.golden import SPLITS, EmptySplitError, GoldenFormatError, Summary, read_golden, validate_folder
from shared.prompts import PROMPT_VERSION, canonical_schema_json, gold_ndjson
from shared.rewards import compute_schema_reward_single, compute_table_reward_single
from shared.split_overlap import SplitOverlapError, check_splits, find_overlaps

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 160)


def _fmt(m: Summary) -> str:
    return f"{m.min:g} · {m.mean:.1f} · {m.max:g}"


@app.command()
def validate(
    folder: Path = typer.Argument(..., help="Folder with common_{train,validation,test}_schemas.jsonl."),
    splits: list[str] = typer.Option(list(SPLITS), "--split", help="Splits to check (repeatable)."),
    strict_splits: bool = typer.Option(
        False,
        "--strict-splits",
        help="Fail when two splits share a document (same id, or same text once whitespace is collapsed and case "
        "folded). Default: a warning with the counts and ids (data build drops such train rows).",
    ),
) -> None:
    """Validate every line of each split file, print counts and statistics, and the documents splits share."""
    try:
        stats = validate_folder(folder, splits)
        examples = {split: read_golden(st.file) for split, st in zip(splits, stats, strict=True)}
        overlap = check_splits(find_overlaps(examples), strict_splits)
    except (GoldenFormatError, EmptySplitError, FileNotFoundError, SplitOverlapError) as exc:
        console.print(f"[red]invalid:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(1) from None
    table = Table(title=f"golden data in {folder}")
    for col in (
        "file",
        "examples",
        "columns/schema min·mean·max",
        "rows/table min·mean·max",
        "text chars min·mean·max",
        "sources",
    ):
        table.add_column(col)
    for s in stats:
        table.add_row(
            Path(s.file).name,
            str(s.examples),
            _fmt(s.columns_per_schema),
            _fmt(s.rows_per_table),
            _fmt(s.text_chars),
            ", ".join(f"{k}={v}" for k, v in sorted(s.sources.items())),
        )
    console.print(table)
    if not overlap.clean:
        console.print(f"[yellow]warning:[/yellow] {overlap.summary()}", soft_wrap=True, highlight=False)
        for pair in overlap.pairs:
            if pair.other_ids:
                console.print(f"  {pair.name}: {pair.other} ids {', '.join(pair.other_ids)}; {pair.base} ids "
                              f"{', '.join(pair.base_ids)}", soft_wrap=True, highlight=False)  # fmt: skip
    console.print(f"[green]ok[/green]: {sum(s.examples for s in stats)} examples valid")


@app.command()
def demo(
    file: Path = typer.Argument(..., help="A golden JSONL file."),
    limit: int = typer.Option(5, help="How many examples to score."),
) -> None:
    """Score gold (perfect) and a degraded prediction for a few examples, side by side."""
    table = Table(title=f"reward demo (prompts {PROMPT_VERSION})")
    for col in ("id", "gold schema", "gold table", "drop-1-column schema", "first-row-only table"):
        table.add_column(col)
    for ex in read_golden(file, limit):
        schema, gtable = ex.schema_dict(), ex.table_dict()
        degraded_schema = '{"columns": ' + str([{"name": n} for n in ex.schema_.names()[:-1]]).replace("'", '"') + "}"
        first_row = gold_ndjson({**gtable, "data": gtable["data"][:1]})
        table.add_row(
            ex.id,
            f"{compute_schema_reward_single(canonical_schema_json(schema), schema).reward:+.3f}",
            f"{compute_table_reward_single(gold_ndjson(gtable), gtable).reward:+.3f}",
            f"{compute_schema_reward_single(degraded_schema, schema).reward:+.3f}",
            f"{compute_table_reward_single(first_row, gtable).reward:+.3f}",
        )
    console.print(table)


def main() -> None:
    app()

"""One ``/reward/pipeline`` call with ``debug`` on, shown as a person reads it: the document, π1's
schema, the Stage-2 prompt the reward API built, the executor's raw output, the parsed rows and the
reward parts."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from shared import PROMPT_VERSION, GoldenExample, gold_table_to_rows, parse_ndjson
from shared.wire import PipelineItem, PipelineRequest
from trainer.reward_client import RewardClient


def pipeline_debug_request(ex: GoldenExample, schema_prediction: str) -> PipelineRequest:
    item = PipelineItem.model_validate(
        {
            "id": ex.id,
            "prediction": schema_prediction,
            "text": ex.text,
            "gold_schema": ex.schema_dict(),
            "gold_table": ex.table_dict(),
        }
    )
    return PipelineRequest(items=[item], debug=True)


def call_pipeline_debug(
    api_url: str, ex: GoldenExample, schema_prediction: str, timeout_s: float = 300.0
) -> dict[str, Any]:
    """POST one item; returns the answer as its JSON object (raises on an HTTP error, never a made-up reward, and
    when the reward API builds its Stage-2 prompt from other templates than the demo's, ``PROMPT_VERSION``)."""
    with RewardClient(api_url, PROMPT_VERSION, timeout_s=timeout_s) as client:
        return client.score(pipeline_debug_request(ex, schema_prediction)).model_dump(mode="json")


def _rows_table(title: str, rows: list[dict[str, Any]]) -> Table:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = Table(*keys, title=title, title_justify="left")
    for r in rows:
        table.add_row(*("" if r.get(k) is None else str(r.get(k)) for k in keys))
    return table


def render_pipeline_debug(console: Console, ex: GoldenExample, schema_prediction: str, response: Any) -> None:
    res = response["results"][0]
    dbg = res.get("debug") or {}
    console.print(Panel(ex.text, title=f"document {ex.id}", title_align="left"))
    console.print(Panel(Text(schema_prediction), title="π1 (sft) predicted schema", title_align="left"))
    messages = dbg.get("messages") or []
    prompt = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages) or "(none: the schema was invalid)"
    console.print(Panel(Text(prompt), title="Stage-2 prompt built by reward_api", title_align="left"))
    raw = dbg.get("executor_output")
    cached = " (from cache)" if dbg.get("cached") else ""
    console.print(Panel(Text(raw if raw is not None else "(no executor call)"),
                        title=f"raw executor output (π2 sft){cached}", title_align="left"))
    pred_rows = parse_ndjson(raw or "")
    gold_rows = gold_table_to_rows(ex.table_dict())
    tables: list[Any] = [
        _rows_table("parsed rows", pred_rows) if pred_rows else Text("parsed rows: none (invalid or empty NDJSON)")
    ]
    tables.append(_rows_table("gold rows", gold_rows))
    console.print(Group(*tables))
    parts = Table("reward part", "value", title="reward parts", title_justify="left")
    aligned = res.get("aligned") or {}
    for key, val in (
        ("reward (a·schema + (1−a)·table)", res["reward"]),
        ("schema_reward", res["schema_reward"]),
        ("schema P / R / F1", f"{res['precision']:.3f} / {res['recall']:.3f} / {res['f1']:.3f}"),
        ("table_reward", res["table_reward"]),
        (f"table_score ({res.get('table_metric', 'aligned')}: the number table_reward maps)", res.get("table_score")),
        ("cell_accuracy (the original positional metric, reported)", res["cell_accuracy"]),
        ("aligned cell F1", aligned.get("cell_f1")),
        ("error", res.get("error")),
    ):
        parts.add_row(key, f"{val:.3f}" if isinstance(val, float) else ("–" if val is None else str(val)))
    console.print(parts)

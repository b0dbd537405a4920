"""Stage-1 / Stage-2 inference against an executor URL, and π1's schemas for the C2 data builder."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared import PROMPT_VERSION, GoldenExample, build_stage1_messages, build_stage2_messages
from trainer.evaluation.generation import (
    GenerationClient,
    Message,
    generate_with_progress,
    messages_hash,
    truncated,
)
from trainer.evaluation.two_stage import Generate, PromptStage

Stage = PromptStage


def stage_messages(stage: Stage, ex: GoldenExample) -> list[Message]:
    """Stage 1 from the document; Stage 2 from the document and the *gold* schema."""
    if stage == "stage1":
        return build_stage1_messages(ex.text)
    return build_stage2_messages(ex.text, ex.schema_dict())


def infer(
    stage: Stage,
    examples: Sequence[GoldenExample],
    client: GenerationClient,
    out: Path | None = None,
    generate: Generate = generate_with_progress,
) -> list[dict[str, Any]]:
    """Predictions for ``examples``: id, stage, prediction, truncated (stopped at max tokens), messages_sha256,
    model, prompt_version.
    ``generate``: how the prompts are sent (with a progress bar, or quietly beside other runs)."""
    prompts = [stage_messages(stage, ex) for ex in examples]
    outputs = asyncio.run(generate(client, prompts, stage))
    records = [
        {
            "id": ex.id,
            "stage": stage,
            "prediction": text,
            "truncated": truncated(text),
            "messages_sha256": messages_hash(msgs),
            "model": client.model,
            "prompt_version": PROMPT_VERSION,
        }
        for ex, msgs, text in zip(examples, prompts, outputs, strict=True)
    ]
    if out is not None:
        write_jsonl(out, records)
    return records


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """``records``, one JSON line each, written whole or not at all (never a truncated file)."""
    from trainer.evaluation.answer_log import write_atomic

    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON: {exc}") from None
    return out


def schema_predictor(client: GenerationClient) -> Callable[[Sequence[GoldenExample], str], list[str]]:
    """π1's schemas for C2's data (:func:`trainer.data.precompute.precompute_c2`): Stage 1 on each document of a
    split, with a progress bar."""

    def predict(examples: Sequence[GoldenExample], split: str) -> list[str]:
        prompts = [build_stage1_messages(ex.text) for ex in examples]
        return asyncio.run(generate_with_progress(client, prompts, f"π1 {split}"))

    return predict

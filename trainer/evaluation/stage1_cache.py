"""π1's Stage-1 schemas of an evaluation, kept on disk under the key of what produced them, so that an
evaluation cut short (a hung executor, a document too long for π2, an allocation that ended) does not redo its
finished Stage 1 when it runs again.

The key (:func:`stage1_key`) is what the schemas depend on: the model's content, the test file's content and how
many of its documents, the generation settings, the Stage-1 prompt's version and how the executor served. A file
written for another key is not used, and is replaced.
Each schema is kept with its finish reason and, where the executor refused its prompt, why: answers cut at the
token limit are still counted as cut, refused ones as refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainer.evaluation.generation import Completion, GenerationConfig, refusal


def stage1_key(
    model_fingerprint: str,
    test_file: Path,
    eval_limit: int | None,
    gen: GenerationConfig,
    serving: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What π1's Stage-1 schemas of an evaluation depend on (every recipe's Phase D keys its cache with this):
    ``model_fingerprint`` is π1's content (:func:`trainer.serving.identity.fingerprint`)."""
    from shared import PROMPT_VERSION
    from shared.golden import sha256_file

    return {
        "model": model_fingerprint,
        "golden": sha256_file(test_file),
        "eval_limit": eval_limit,
        "generation": dataclasses.asdict(gen),
        "prompt_version": PROMPT_VERSION,
        "serving": dict(serving) if serving is not None else None,
    }


def cached_stage1(path: Path, key: Mapping[str, Any], run: Callable[[], list[str]]) -> tuple[list[str], bool]:
    """The schemas kept in ``path`` for ``key``, else ``run()``'s, written there; and whether they were kept."""
    want = json.loads(json.dumps(key, default=str))
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept.get("key") == want:
            return [Completion(s["text"], s.get("finish_reason"), s.get("refused")) for s in kept["schemas"]], True
    schemas = run()
    rows = [
        {"text": str(s), "finish_reason": getattr(s, "finish_reason", None), "refused": refusal(s)} for s in schemas
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": want, "schemas": rows}, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return schemas, False

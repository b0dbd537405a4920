"""Stage-2 prompts that cannot fit the executor's context are counted and dropped from C1 data, measured
with the executor model's real tokenizer (SmolLM2, the CPU executor's model) and its chat template."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from shared import build_stage2_messages, read_split
from trainer.data.datasets import build_datasets, read_rows
from trainer.data.prompt_fit import Stage2Fit


@pytest.fixture(scope="module")
def fit_model(default_model_dir: Path) -> Path:
    return default_model_dir


def test_counts_are_the_chat_templates_tokens(fit_model: Path, golden_dir: Path) -> None:
    ex = next(iter(read_split(golden_dir, "test", limit=1)))
    msgs = build_stage2_messages(ex.text, ex.schema_dict())
    fit = Stage2Fit(fit_model, 10**6)
    n = fit.tokens(msgs)
    assert len(ex.text) // 8 < n < len(json.dumps(msgs))  # the document is in it, and no more than a token a byte
    assert Stage2Fit(fit_model, n + 1).fits(msgs) and not Stage2Fit(fit_model, n).fits(msgs)  # room for one token


def test_c1_drops_documents_whose_stage2_prompt_cannot_fit(fit_model: Path, golden_dir: Path, tmp_path: Path) -> None:
    examples = list(read_split(golden_dir, "validation", limit=20))
    probe = Stage2Fit(fit_model, 10**6)
    counts = {ex.id: probe.tokens(build_stage2_messages(ex.text, ex.schema_dict())) for ex in examples}
    limit = int(statistics.median(counts.values()))
    too_long = sorted(i for i, n in counts.items() if n >= limit)
    assert 0 < len(too_long) < len(examples)

    built = build_datasets(
        golden_dir, tmp_path, ["b1", "c1"], ["validation"], limit=20, stage2_fit=Stage2Fit(fit_model, limit)
    )

    assert built["c1"]["validation"] == len(examples) - len(too_long)
    assert built["b1"]["validation"] == len(examples)  # Stage-1 phases without an executor keep every document
    kept = {r["extra_info"]["id"] for r in read_rows(tmp_path / "c1" / "validation.parquet")}
    assert kept == {ex.id for ex in examples} - set(too_long)
    c1 = json.loads((tmp_path / "manifest.json").read_text())["phases"]["c1"]
    assert c1["stage2_too_long"] == {"validation": len(too_long)} and c1["stage2_max_model_len"] == limit
    assert c1["stage2_too_long_ids"] == {"validation": too_long}


def test_no_check_keeps_every_document(golden_dir: Path, tmp_path: Path) -> None:
    built = build_datasets(golden_dir, tmp_path, ["c1"], ["validation"], limit=5)
    assert built["c1"]["validation"] == 5
    assert "stage2_too_long" not in json.loads((tmp_path / "manifest.json").read_text())["phases"]["c1"]

"""The C2 data builder (trainer/data/precompute.py) with a scripted π1; the vLLM path is in
tests/trainer/evaluation/test_inference_vllm.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from shared import GoldenExample
from trainer.data.precompute import precompute_c2, seeded_sample
from trainer.data.sample_data import SAMPLE_DIR


def test_seeded_sample_is_reproducible_ordered_and_whole_when_short() -> None:
    items = list(range(100))
    a, b = seeded_sample(items, 10, seed=3), seeded_sample(items, 10, seed=3)
    assert a == b and len(a) == 10 and len(set(a)) == 10
    assert a == sorted(a)  # file order is kept
    assert seeded_sample(items, 10, seed=4) != a  # the seed decides which
    assert seeded_sample(items, 100, seed=3) == items and seeded_sample(items, 500, seed=3) == items


@pytest.mark.parametrize(
    ("sample", "message"),
    [({"test": 5}, r"sample: splits \['test'\] are not among \['train', 'validation'\]"), ({"train": 0}, ">= 1")],
)
def test_precompute_names_a_bad_sample_before_calling_the_executor(
    tmp_path: Path, sample: dict[str, int], message: str
) -> None:
    no_predictor = cast(Any, None)  # never reached: the arguments are checked first
    with pytest.raises(ValueError, match=message):
        precompute_c2(SAMPLE_DIR, tmp_path, no_predictor, "pi1", sample=sample)
    assert not (tmp_path / "c2").exists()


def test_rows_are_stage2_prompts_on_the_predicted_schema_and_invalid_ones_are_counted(tmp_path: Path) -> None:
    """A scripted π1: the gold schema for every document but the first of each split, which gets no JSON."""
    import json

    from shared import build_stage2_messages, canonical_schema_json, read_golden
    from trainer.data.datasets import read_rows

    seen: list[str] = []

    def predict(examples: Sequence[GoldenExample], split: str) -> list[str]:
        seen.append(split)
        return ["no schema"] + [canonical_schema_json(ex.schema_dict()) for ex in examples[1:]]

    rep = precompute_c2(SAMPLE_DIR, tmp_path, predict, "pi1-pipe", on_invalid="gold", limit=3)
    assert seen == ["train", "validation"]
    assert rep.counts == {"train": 3, "validation": 3} and rep.invalid == {"train": 1, "validation": 1}
    examples = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl", 3)
    rows = read_rows(tmp_path / "c2" / "train.parquet")
    # the invalid one was given the gold schema (on_invalid="gold"); every prompt is Stage 2, rewarded as a table
    assert [r["prompt"] for r in rows] == [build_stage2_messages(ex.text, ex.schema_dict()) for ex in examples]
    assert all(r["data_source"].startswith("table:") and r["extra_info"]["phase"] == "c2" for r in rows)
    manifest = json.loads((tmp_path / "manifest.json").read_text())["phases"]["c2"]
    assert manifest["schema_model"] == "pi1-pipe" and manifest["invalid_schemas"] == {"train": 1, "validation": 1}
    skipped = precompute_c2(SAMPLE_DIR, tmp_path / "skip", predict, "pi1-pipe", on_invalid="skip", limit=3)
    assert skipped.counts == {"train": 2, "validation": 2}


def test_a_predictor_that_loses_documents_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 predicted schemas for 3 documents"):
        precompute_c2(SAMPLE_DIR, tmp_path, lambda examples, split: ["{}"] * 2, "pi1", limit=3)


def test_sources_narrow_a_split_before_its_sample(tmp_path: Path) -> None:
    """``sources``: C2 drawn where the headroom is (WikiTableText here); π1 is asked only for those
    documents, the sample comes from them, the other split stays whole, and the manifest says so."""
    import json

    from shared.golden import source_of
    from trainer.data.datasets import read_rows

    asked: dict[str, list[str]] = {}

    def predict(examples: Sequence[GoldenExample], split: str) -> list[str]:
        asked[split] = [ex.id for ex in examples]
        return [json.dumps(ex.schema_dict()) for ex in examples]

    rep = precompute_c2(SAMPLE_DIR, tmp_path, predict, "pi1", sample={"train": 3}, sources={"train": ["people"]})
    assert len(asked["train"]) == 3 and {source_of(i) for i in asked["train"]} == {"people"}
    assert {source_of(i) for i in asked["validation"]} == {"invoice", "people", "product"}
    assert rep.counts == {"train": 3, "validation": 6}
    assert [r["extra_info"]["id"] for r in read_rows(tmp_path / "c2" / "train.parquet")] == asked["train"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["phases"]["c2"]["sources"] == {"train": ["people"]}


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ({"test": ["people"]}, r"sources: splits \['test'\] are not among \['train', 'validation'\]"),
        ({"train": ["wikitabletext"]}, r"sources\['train'\]: no document of source\(s\) \['wikitabletext'\]"),
    ],
)
def test_precompute_names_bad_sources_before_calling_the_executor(
    tmp_path: Path, sources: dict[str, list[str]], message: str
) -> None:
    def predict(examples: Sequence[GoldenExample], split: str) -> list[str]:
        raise AssertionError("the executor was asked")

    with pytest.raises(ValueError, match=message):
        precompute_c2(SAMPLE_DIR, tmp_path, predict, "pi1", sources=sources)
    assert not (tmp_path / "c2").exists()

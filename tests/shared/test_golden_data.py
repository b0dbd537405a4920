"""Every real golden example through both builders and both metrics, gold as the prediction."""

import json
from pathlib import Path

import pytest

from shared import (
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    iter_golden,
    validate_folder,
)
from shared.golden import SPLITS, golden_filename


def test_all_three_files_validate(golden_dir: Path) -> None:
    stats = validate_folder(golden_dir)
    assert all(s.examples > 0 for s in stats)


@pytest.mark.parametrize("split", SPLITS)
def test_gold_as_prediction_is_perfect(golden_dir: Path, split: str) -> None:
    n = 0
    for ex in iter_golden(golden_dir / golden_filename(split)):
        schema, table = ex.schema_dict(), ex.table_dict()
        s1 = build_stage1_messages(ex.text)
        s2 = build_stage2_messages(ex.text, schema)
        assert ex.text in s1[1]["content"] and ex.text in s2[1]["content"]
        assert json.loads(s2[1]["content"].split("[SCHEMA]\n", 1)[1].split("\n\n", 1)[0])["fields"] == schema["columns"]
        s = compute_schema_reward_single(canonical_schema_json(schema), schema)
        t = compute_table_reward_single(gold_ndjson(table), table)
        assert (s.reward, s.f1, s.valid_json) == (1.0, 1.0, True), ex.id
        assert (t.reward, t.cell_accuracy, t.valid_json) == (1.0, 1.0, True), ex.id
        assert t.aligned is not None and t.aligned.cell_f1 == 1.0 and t.aligned.row_exact_match == 1.0, ex.id
        n += 1
    assert n > 0

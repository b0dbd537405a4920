from __future__ import annotations

import pytest

from trainer.in_verl.reward_batcher import SCORE_KEYS, build_item, score_dict
from trainer.registry.data_source import belongs_to, data_source, reward_kind, source_part


def test_data_source_tags_the_golden_source() -> None:
    ds = data_source("table", "wikitabletext-validation-00012")
    assert ds == "table:wikitabletext"
    assert (reward_kind(ds), source_part(ds)) == ("table", "wikitabletext")
    assert (reward_kind("pipeline"), source_part("pipeline")) == ("pipeline", None)
    assert belongs_to(ds, "table") and belongs_to("table", "table") and not belongs_to("tablet", "table")


def test_the_reward_kind_picks_the_endpoint_and_keys() -> None:
    item = build_item(reward_kind("table:e2e"), "i", "{}", {"table": {"columns": ["a"], "data": [["1"]]}})
    assert set(item) == {"id", "prediction", "gold_table"}
    # the wire's table result names its mapped number table_score; VERL's score is the reward
    result = {"reward": 0.5, "valid_json": True, "table_score": 0.75, "cell_accuracy": 0.5}
    parts = {"score": 0.5, "valid_json": 1.0, "table_score": 0.75, "cell_accuracy": 0.5}
    assert {k: v for k, v in score_dict("table", result).items() if k in parts} == parts
    assert tuple(score_dict("table", result)) == SCORE_KEYS["table"]
    with pytest.raises(ValueError, match="data_source must be one of"):
        build_item("tablet", "i", "{}", {})

"""The default table reward matches column names
through ``normalize_name``, as the schema reward does, so a correct value under ``teamName`` counts
when the gold says ``team_name``. The original positional metric keeps literal keys (``table_metric:
positional``). These tests pin both, so a change to either side is a visible choice.
"""

from __future__ import annotations

import json

import pytest

from shared import combine_pipeline_reward, compute_schema_reward_single, compute_table_reward_single
from shared.rewards import TableRewardConfig

GOLD_SCHEMA = {"table_id": "t", "columns": [{"name": "team_name"}, {"name": "points"}]}
GOLD_TABLE = {**GOLD_SCHEMA, "data": [["Hawks", "101"], ["Bulls", "99"]]}
CAMEL_SCHEMA = json.dumps({"columns": [{"name": "teamName"}, {"name": "points"}]})
ZERO_TO_ONE = TableRewardConfig(min_reward=0.0, max_reward=1.0)
POSITIONAL = TableRewardConfig(min_reward=0.0, max_reward=1.0, table_metric="positional")


def rows(key: str) -> str:
    return "\n".join(json.dumps({key: team, "points": pts}) for team, pts in GOLD_TABLE["data"])


def test_schema_reward_accepts_the_camel_case_name() -> None:
    schema = compute_schema_reward_single(CAMEL_SCHEMA, GOLD_SCHEMA)
    assert schema.valid_json and schema.f1 == 1.0 and schema.reward == 1.0


@pytest.mark.parametrize("key", ["teamName", "Team Name", "team-name", "TEAM_NAME"])
def test_default_table_reward_normalises_names_like_the_schema_reward(key: str) -> None:
    exact = compute_table_reward_single(rows("team_name"), GOLD_TABLE, ZERO_TO_ONE)
    renamed = compute_table_reward_single(rows(key), GOLD_TABLE, ZERO_TO_ONE)
    assert exact.reward == renamed.reward == 1.0


def test_positional_table_reward_still_matches_keys_literally() -> None:
    renamed = compute_table_reward_single(rows("teamName"), GOLD_TABLE, POSITIONAL)
    # team_name: 0 of 2 cells; points: 2 of 2. The union of keys per row is 3 (teamName, team_name,
    # points), so each row scores 1/3: the literal mismatch costs the column *and* counts as extra.
    assert renamed.valid_json and renamed.cell_accuracy == pytest.approx(1 / 3) == renamed.reward


def test_pipeline_reward_agrees_with_schema_f1_on_name_formatting() -> None:
    """C1: a camelCase name that schema F1 accepts costs nothing in the table part either."""
    schema = compute_schema_reward_single(CAMEL_SCHEMA, GOLD_SCHEMA)
    exact = combine_pipeline_reward(schema, compute_table_reward_single(rows("team_name"), GOLD_TABLE))
    renamed = combine_pipeline_reward(schema, compute_table_reward_single(rows("teamName"), GOLD_TABLE))
    assert renamed.reward == exact.reward == 1.0


def test_a_synonym_filled_correctly_never_beats_the_gold_name() -> None:
    """'year' for 'season': a false positive and a false negative, as in schema F1; never above the gold."""
    gold = {"columns": ["season", "team"], "data": [["2001", "hawks"]]}
    right = compute_table_reward_single('{"season": "2001", "team": "hawks"}', gold)
    synonym = compute_table_reward_single('{"year": "2001", "team": "hawks"}', gold)
    dropped = compute_table_reward_single('{"team": "hawks"}', gold)
    assert right.score == 1.0 and synonym.score == pytest.approx(0.5) and dropped.score == pytest.approx(2 / 3)
    schema_syn = compute_schema_reward_single('["year", "team"]', {"columns": ["season", "team"]})
    schema_drop = compute_schema_reward_single('["team"]', {"columns": ["season", "team"]})
    # the table part orders the two mistakes as schema F1 does
    assert (synonym.score < dropped.score) == (schema_syn.f1 < schema_drop.f1)

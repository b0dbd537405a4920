"""Issue 17.7, decided: the table reward matches column keys literally, the schema reward normalises.

docs/reward_api.md ("Table reward keys are matched literally") states why this is the right pressure
for pipeline RL. These tests pin the decision, so a change to either side is a visible choice.
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


def rows(key: str) -> str:
    return "\n".join(json.dumps({key: team, "points": pts}) for team, pts in GOLD_TABLE["data"])


def test_schema_reward_accepts_the_camel_case_name() -> None:
    schema = compute_schema_reward_single(CAMEL_SCHEMA, GOLD_SCHEMA)
    assert schema.valid_json and schema.f1 == 1.0 and schema.reward == 1.0


def test_table_reward_scores_every_cell_of_a_renamed_column_zero() -> None:
    exact = compute_table_reward_single(rows("team_name"), GOLD_TABLE, ZERO_TO_ONE)
    renamed = compute_table_reward_single(rows("teamName"), GOLD_TABLE, ZERO_TO_ONE)
    assert exact.cell_accuracy == 1.0
    # team_name: 0 of 2 cells; points: 2 of 2. The union of keys per row is 3 (teamName, team_name,
    # points), so each row scores 1/3: the literal mismatch costs the column *and* counts as extra.
    assert renamed.valid_json and renamed.cell_accuracy == pytest.approx(1 / 3)


def test_pipeline_reward_keeps_the_pressure_on_exact_names() -> None:
    """C1: same schema F1, lower pipeline reward when π2 writes the camelCase key π1 proposed."""
    schema = compute_schema_reward_single(CAMEL_SCHEMA, GOLD_SCHEMA)
    exact = combine_pipeline_reward(schema, compute_table_reward_single(rows("team_name"), GOLD_TABLE))
    renamed = combine_pipeline_reward(schema, compute_table_reward_single(rows("teamName"), GOLD_TABLE))
    assert renamed.reward < exact.reward

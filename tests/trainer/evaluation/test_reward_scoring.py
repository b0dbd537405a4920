"""Scoring samples through reward_api (preflight, RFT): the wire items, the batches, the ranking of gold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared import read_golden
from trainer.evaluation.reward_scoring import gold_target, prompt_for, reward_item, score, score_results
from trainer.rft import select_best

SAMPLE = Path(__file__).resolve().parents[3] / "trainer" / "data" / "sample"


def test_reward_items_follow_the_wire_contract() -> None:
    ex = read_golden(SAMPLE / "common_train_schemas.jsonl", 1)[0]
    assert set(reward_item("schema", ex, "a", "p")) == {"id", "prediction", "gold_schema"}
    assert set(reward_item("table", ex, "a", "p")) == {"id", "prediction", "gold_table"}
    assert set(reward_item("pipeline", ex, "a", "p")) == {"id", "prediction", "text", "gold_schema", "gold_table"}


def test_the_prompt_of_a_reward_kind() -> None:
    ex = read_golden(SAMPLE / "common_train_schemas.jsonl", 1)[0]
    assert prompt_for("schema", ex) == prompt_for("pipeline", ex) != prompt_for("table", ex)
    assert ex.text in prompt_for("table", ex)[-1]["content"]


@pytest.fixture(scope="module")
def reward_api() -> Any:
    from tests.helpers.servers import RewardApiServer

    with RewardApiServer() as srv:
        yield srv


@pytest.mark.service
@pytest.mark.parametrize("reward", ["schema", "table"])
def test_reward_api_ranks_gold_first(reward_api: Any, reward: Any) -> None:
    examples = read_golden(SAMPLE / "common_train_schemas.jsonl", 3)
    items = []
    for ex in examples:
        items.append(reward_item(reward, ex, f"{ex.id}#0", "not json at all"))
        items.append(reward_item(reward, ex, f"{ex.id}#1", gold_target(reward, ex)))
    rewards = score(reward_api.url, reward, items)
    assert rewards[0::2] == [-1.0] * 3
    assert rewards[1::2] == [1.0] * 3
    assert [select_best(rewards[i : i + 2], 0.5) for i in range(0, 6, 2)] == [1, 1, 1]


def test_score_results_batches_under_the_services_item_limit() -> None:
    """A preflight sweep scores prompts x sources x (n + 1) items: more than reward_api takes in one request
    (REWARD_API_MAX_ITEMS). score_results sends them in batches, results in order (one POST of 10,200
    items would get a 413 and lose the sweep)."""
    from services.reward_api.app import create_app
    from services.reward_api.settings import Settings
    from tests.helpers.servers import ThreadServer

    items = [{"id": f"i{k}", "prediction": '["a"]' if k % 2 else "nope", "gold_schema": {"columns": [{"name": "a"}]}}
             for k in range(25)]  # fmt: skip
    with ThreadServer(create_app(Settings(max_items=10))) as srv:
        with pytest.raises(RuntimeError, match="413"):
            score_results(srv.url, "schema", items, batch=25)
        results = score_results(srv.url, "schema", items, batch=10)
        in_parallel = score_results(srv.url, "schema", items, batch=3, parallel=4)  # 9 batches, 4 at once
    assert [r["id"] for r in results] == [it["id"] for it in items]
    assert [r["reward"] for r in results] == [1.0 if k % 2 else -1.0 for k in range(25)]
    assert in_parallel == results

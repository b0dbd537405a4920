"""RFT baseline: selection rule, reward items, and the real sample → score → parquet path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from shared import read_golden
from trainer.rft import RftConfig, build_rft_data, gold_target, reward_item, score, select_best

SAMPLE = Path(__file__).resolve().parents[2] / "trainer" / "data" / "sample"


def test_select_best_threshold_and_ties() -> None:
    assert select_best([0.1, 0.7, 0.7, 0.2], 0.5) == 1
    assert select_best([0.1, 0.4], 0.5) is None
    assert select_best([-1.0], -1.0) == 0
    assert select_best([], 0.0) is None


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="k must be"):
        RftConfig(k=0)
    with pytest.raises(ValueError, match="threshold"):
        RftConfig(threshold=2.0)


def test_reward_items_follow_the_wire_contract() -> None:
    ex = read_golden(SAMPLE / "common_train_schemas.jsonl", 1)[0]
    assert set(reward_item("schema", ex, "a", "p")) == {"id", "prediction", "gold_schema"}
    assert set(reward_item("table", ex, "a", "p")) == {"id", "prediction", "gold_table"}
    assert set(reward_item("pipeline", ex, "a", "p")) == {"id", "prediction", "text", "gold_schema", "gold_table"}


@pytest.fixture(scope="module")
def reward_api() -> Any:
    from tests.helpers.servers import RewardApiServer

    with RewardApiServer() as srv:
        yield srv


@pytest.mark.service
@pytest.mark.parametrize("stage", ["schema", "table"])
def test_reward_api_ranks_gold_first(reward_api: Any, stage: Any) -> None:
    examples = read_golden(SAMPLE / "common_train_schemas.jsonl", 3)
    items = []
    for ex in examples:
        items.append(reward_item(stage, ex, f"{ex.id}#0", "not json at all"))
        items.append(reward_item(stage, ex, f"{ex.id}#1", gold_target(stage, ex)))
    rewards = score(reward_api.url, stage, items)
    assert rewards[0::2] == [-1.0] * 3
    assert rewards[1::2] == [1.0] * 3
    assert [select_best(rewards[i : i + 2], 0.5) for i in range(0, 6, 2)] == [1, 1, 1]


@pytest.mark.vllm
@pytest.mark.service
def test_build_rft_data_with_real_policy(reward_api: Any, cpu_executor: Any, tmp_path: Path) -> None:
    cfg = RftConfig(k=2, threshold=-1.0, temperature=1.0, max_tokens=48)
    rep = build_rft_data(
        SAMPLE, tmp_path, "schema", cpu_executor.url, cpu_executor.served_model_name, reward_api.url, cfg, limit=2
    )
    assert rep.prompts == 2 and rep.samples == 4 and rep.kept == 2  # threshold -1 keeps every best
    rows = pq.read_table(tmp_path / "data" / "a1" / "train.parquet").to_pylist()
    assert len(rows) == 2
    assert [m["role"] for m in rows[0]["messages"]][-1] == "assistant" and rows[0]["messages"][-1]["content"]
    val = pq.read_table(tmp_path / "data" / "a1" / "validation.parquet").to_pylist()
    assert len(val) == 2 and (tmp_path / "rft_report.json").is_file()
    with pytest.raises(ValueError, match="kept no sample"):
        build_rft_data(
            SAMPLE,
            tmp_path / "x",
            "schema",
            cpu_executor.url,
            cpu_executor.served_model_name,
            reward_api.url,
            RftConfig(k=1, threshold=1.0, max_tokens=8),
            limit=1,
        )


def test_score_results_batches_under_the_services_item_limit() -> None:
    """A preflight sweep scores prompts x sources x (n + 1) items: more than reward_api takes in one request
    (REWARD_API_MAX_ITEMS). score_results sends them in batches, results in order (issue 23's GPU lease
    lost its sweep to a 413 for 10,200 items in one POST)."""
    from services.reward_api.app import create_app
    from services.reward_api.settings import Settings
    from tests.helpers.servers import ThreadServer
    from trainer.rft import score_results

    items = [{"id": f"i{k}", "prediction": '["a"]' if k % 2 else "nope", "gold_schema": {"columns": [{"name": "a"}]}}
             for k in range(25)]  # fmt: skip
    with ThreadServer(create_app(Settings(max_items=10))) as srv:
        with pytest.raises(RuntimeError, match="413"):
            score_results(srv.url, "schema", items, batch=25)
        results = score_results(srv.url, "schema", items, batch=10)
    assert [r["id"] for r in results] == [it["id"] for it in items]
    assert [r["reward"] for r in results] == [1.0 if k % 2 else -1.0 for k in range(25)]

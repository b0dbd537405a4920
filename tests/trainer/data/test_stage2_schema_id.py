"""Every Stage-2 prompt carries the same neutral ``schema_id``, never the gold example id.

The gold ids name the source and the split (``rotowire_sent-train-…``, ``e2e-…-test-…``); the model
must not see them. SFT (A2) and RL (B2) data, the reward API's pipeline prompt and evaluation all
build the prompt through ``shared.build_stage2_messages``, so they must agree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq

from shared import build_stage2_messages, read_golden

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "trainer" / "data" / "sample"


def schema_block(user: str) -> dict[str, object]:
    value = json.loads(user.split("[SCHEMA]\n", 1)[1].split("\n\n", 1)[0])
    assert isinstance(value, dict)
    return value


def stage2_users(path: Path, column: str) -> list[str]:
    return [next(m["content"] for m in row if m["role"] == "user") for row in pq.read_table(path)[column].to_pylist()]


def test_sft_and_rl_data_carry_the_neutral_id(tmp_path: Path) -> None:
    from trainer.data.datasets import build_datasets

    build_datasets(SAMPLE, tmp_path, ["a2", "b2"])
    gold_ids = {
        ex.id for split in ("train", "validation") for ex in read_golden(SAMPLE / f"common_{split}_schemas.jsonl")
    }
    gold_ids |= {
        ex.schema_.table_id for split in ("train",) for ex in read_golden(SAMPLE / f"common_{split}_schemas.jsonl")
    }
    users = stage2_users(tmp_path / "a2" / "train.parquet", "messages")
    users += stage2_users(tmp_path / "b2" / "train.parquet", "prompt")
    users += stage2_users(tmp_path / "b2" / "validation.parquet", "prompt")
    assert users
    for user in users:
        assert schema_block(user)["schema_id"] == "schema"
        leaked = [gid for gid in gold_ids if gid and gid in user]
        assert not leaked, f"gold id(s) {leaked} in a Stage-2 prompt"


def test_reward_api_builds_the_same_prompt_as_training() -> None:
    from services.reward_api.pipeline import _prepare
    from shared import stage2_template
    from shared.rewards import PipelineSchemaRewardConfig
    from shared.wire import PipelineItem

    ex = read_golden(SAMPLE / "common_test_schemas.jsonl", 1)[0]
    prediction = json.dumps({"columns": [{"name": c["name"]} for c in ex.schema_dict()["columns"]]})
    item = PipelineItem.model_validate(
        {
            "id": "x",
            "prediction": prediction,
            "text": ex.text,
            "gold_schema": ex.schema_dict(),
            "gold_table": ex.table_dict(),
        }
    )
    [prepared] = _prepare([item], PipelineSchemaRewardConfig(), stage2_template(), None)
    assert prepared.messages == build_stage2_messages(ex.text, prediction)
    assert (
        ex.id not in json.dumps(prepared.messages)
        and schema_block(prepared.messages[1]["content"])["schema_id"] == "schema"
    )


def test_no_caller_passes_an_example_id_as_schema_id() -> None:
    """Evaluation (Phase D), the C2 precompute and the loop build prompts without an id of their own."""
    callers = [*(REPO / "trainer").rglob("*.py"), *(REPO / "services").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    offenders = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in callers
        for line in p.read_text().splitlines()
        if re.search(r"build_stage2_messages\(.*schema_id=", line)
    ]
    assert offenders == []

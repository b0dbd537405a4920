"""The failure policy's parts: the reward failure log, the cause it names, the share rule, the record."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from trainer.phase_rules.rollout_failures import (
    FailureCount,
    FailurePolicy,
    RewardFailureLog,
    RolloutFailureError,
    describe_cause,
    judge,
    read_failure,
    record_reward_failure,
)


def test_the_log_yields_only_what_was_appended_since_the_last_read(tmp_path: Path) -> None:
    path = tmp_path / "reward_failures.jsonl"
    record_reward_failure(path, "table", "old", RuntimeError("from an earlier run"))
    log = RewardFailureLog(path)  # created at trainer start: earlier runs' lines are not this run's cause
    assert log.new_entries() == []
    record_reward_failure(path, "table", "x1", RuntimeError("http://h/reward/table: HTTP 503"))
    record_reward_failure(path, "table", "x2", RuntimeError("http://h/reward/table: HTTP 503"))
    entries = log.new_entries()
    assert [e["id"] for e in entries] == ["x1", "x2"]
    assert entries[0]["error"] == "RuntimeError: http://h/reward/table: HTTP 503"
    assert log.new_entries() == []
    with path.open("a") as fh:
        fh.write('{"id": "half-writ')  # a line still being written is left for the next read
    assert log.new_entries() == []


def test_describe_cause_counts_distinct_errors() -> None:
    entries = [{"error": "A: down"}] * 3 + [{"error": "B: 429"}]
    assert describe_cause(entries) == "A: down (3 samples); B: 429 (1 sample)"
    assert "no reward error was recorded" in describe_cause([])


@pytest.mark.parametrize(
    ("failed", "expected", "max_share", "stops"),
    [(0, 8, 0.0, False), (1, 8, 0.0, True), (1, 8, 0.125, False), (2, 8, 0.125, True)],
)
def test_share_rule(tmp_path: Path, failed: int, expected: int, max_share: float, stops: bool) -> None:
    count = FailureCount("training", 4, failed, expected)
    error = judge(count, FailurePolicy(max_share=max_share), "X: boom", tmp_path / "f.json")
    assert (error is not None) == stops
    assert (tmp_path / "f.json").is_file() == stops
    if error is not None:
        assert isinstance(error, RolloutFailureError)
        assert f"training step 4: {failed} of {expected} samples failed" in str(error) and "Cause: X: boom" in str(
            error
        )
        record = read_failure(tmp_path / "f.json")
        assert record is not None and record["cause"] == "X: boom" and record["step"] == 4


def test_metrics_are_counted_either_way() -> None:
    m = FailureCount("validation", 2, 1, 4).as_metrics()
    assert m == {
        "validation/rollout_failure/failed_samples": 1.0,
        "validation/rollout_failure/expected_samples": 4.0,
        "validation/rollout_failure/share": 0.25,
    }


def test_max_share_is_checked() -> None:
    with pytest.raises(ValueError, match="max_share"):
        FailurePolicy.model_validate({"max_share": 1.0})
    with pytest.raises(ValueError, match="extra"):
        FailurePolicy.model_validate({"max_shares": 0.1})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reward_fn_records_the_client_error_with_its_endpoint_then_raises(tmp_path: Path) -> None:
    """VERL's compute_score call: a dead reward API leaves the cause; in penalize mode it raises (no invented
    score), in mask mode the sample is masked (score 0, no gradient)."""
    from trainer.in_verl.reward_batcher import RewardServiceError
    from trainer.in_verl.reward_fn import compute_score

    url = f"http://127.0.0.1:{closed_port()}"
    log = tmp_path / "reward_failures.jsonl"
    gt = json.dumps({"schema": {"columns": [{"name": "a"}]}})

    async def call() -> None:
        await compute_score("schema", '{"columns": ["a"]}', gt, {"id": "s1"}, url=url, max_attempts=1,
                            failure_log=str(log), failure_mode="penalize")  # fmt: skip

    with pytest.raises(RewardServiceError, match=f"{url}/reward/schema: ConnectError"):
        asyncio.run(call())
    masked = asyncio.run(compute_score("schema", "{}", gt, {"id": "s2"}, url=url, max_attempts=1, failure_log=str(log)))
    assert masked["masked"] == masked["reward_call_failed"] == 1.0 and masked["score"] == 0.0
    entry, second = [json.loads(line) for line in log.read_text().splitlines()]
    assert second["id"] == "s2" and "ConnectError" in second["error"]
    assert entry["id"] == "s1" and entry["data_source"] == "schema"
    assert entry["error"].startswith(f"RewardServiceError: {url}/reward/schema: ConnectError")

"""Pieces of the GRPO smoke's checks: loopback detection and reading reward_api's counters."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from shared import read_golden
from trainer.smoke.grpo import SAMPLE_DIR, MemorySampler, counter_total, is_loopback, reward_parts


@pytest.mark.parametrize(
    ("addr", "loop"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::", False),
        ("0.0.0.0", False),
        ("192.0.2.10", False),
    ],
)
def test_is_loopback(addr: str, loop: bool) -> None:
    assert is_loopback(addr) is loop


def test_non_loopback_lists_offenders_with_process() -> None:
    m = MemorySampler(1)
    m.listeners = {"127.0.0.1:5 (a)", "::ffff:127.0.0.1:6 (b)", ":::7 (raylet)"}
    assert m.non_loopback() == [":::7 (raylet)"]


@pytest.mark.service
def test_counter_total_reads_the_real_reward_api_metrics() -> None:
    from tests.helpers.servers import RewardApiServer

    ex = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl", 1)[0]
    items = [{"id": str(i), "prediction": "{}", "gold_schema": ex.schema_dict()} for i in range(3)]
    with RewardApiServer() as srv:
        assert httpx.post(f"{srv.url}/reward/schema", json={"items": items}, timeout=30).status_code == 200
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    assert counter_total(text, "reward_api_items_total", 'endpoint="/reward/schema"') == 3.0
    assert counter_total(text, "reward_api_items_total", 'endpoint="/reward/pipeline"') == 0.0


def test_exposed_accepts_wildcards_only_in_a_loopback_only_namespace() -> None:
    m = MemorySampler(1)
    m.listeners = {"127.0.0.1:5 (a)", ":::7 (python)", "0.0.0.0:8 (raylet)", "192.0.2.10:9 (x)"}
    assert m.exposed({"lo"}) == ["192.0.2.10:9 (x)"]
    assert m.exposed({"lo", "eth0"}) == ["0.0.0.0:8 (raylet)", "192.0.2.10:9 (x)", ":::7 (python)"]


def test_reward_parts_keeps_scores_and_our_parts_per_step() -> None:
    logged = [
        {"step": 1, "data": {"critic/score/mean": 0.25, "timing_s/gen": 3.0, "val-aux/pipeline/f1/mean@1": 0.5}},
        {"step": 2, "data": {"val-core/pipeline/reward/mean@1": -0.1, "val-aux/pipeline/f1/mean@1": "n/a"}},
    ]
    assert reward_parts(logged) == {
        1: {"critic/score/mean": 0.25, "val-aux/pipeline/f1/mean@1": 0.5},
        2: {"val-core/pipeline/reward/mean@1": -0.1},
    }


@pytest.mark.service
def test_killer_kills_the_real_reward_api_once_the_step_is_validated(tmp_path: Path) -> None:
    """--kill-reward-api: nothing happens before step N's validation is recorded, then the API dies."""
    import json
    import time

    from services.reward_api.process import RewardApiProcess
    from trainer.smoke.grpo import RewardApiKiller

    state = tmp_path / "early_stopping.json"
    with RewardApiProcess(log_path=tmp_path / "api.log") as api:
        with RewardApiKiller(api, state, after_step=2, interval_s=0.1) as killer:
            state.write_text(json.dumps({"history": [{"step": 1, "score": 0.1, "improved": True}]}))
            time.sleep(0.5)
            assert killer.killed_at is None and httpx.get(f"{api.url}/healthz").status_code == 200
            state.write_text(json.dumps({"history": [{"step": 1}, {"step": 2}]}))
            deadline = time.monotonic() + 10
            while killer.killed_at is None and time.monotonic() < deadline:
                time.sleep(0.1)
        assert killer.killed_at is not None and "reward_api_" in killer.metrics_text
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{api.url}/healthz", timeout=2)

"""``python -m services.reward_api``: the worker count comes from ``--workers``, else ``REWARD_API_WORKERS``."""

from __future__ import annotations

from typing import Any

import pytest

import services.reward_api.__main__ as entry


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(entry.uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/unused-by-this-test")
    return calls


def test_workers_from_the_environment(runs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_API_WORKERS", "16")
    entry.main(["--port", "1"])
    assert runs[-1]["workers"] == 16


def test_the_flag_wins_and_the_default_is_one(runs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_API_WORKERS", "16")
    entry.main(["--workers", "2"])
    assert runs[-1]["workers"] == 2
    monkeypatch.delenv("REWARD_API_WORKERS")
    entry.main([])
    assert runs[-1]["workers"] == 1


def test_a_bad_value_is_refused(runs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_API_WORKERS", "many")
    with pytest.raises(SystemExit):
        entry.main([])
    monkeypatch.setenv("REWARD_API_WORKERS", "0")
    with pytest.raises(SystemExit):
        entry.main([])
    assert runs == []

"""Settings parsing: lists from comma-separated env vars, URL normalisation, empty means unset."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.reward_api.settings import Settings


def test_lists_urls_and_empty_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_API_EXECUTOR_URLS", "http://a:8001/v1/, http://b:8001")
    monkeypatch.setenv("REWARD_API_STOP", '["\\n\\n", "</s>"]')
    monkeypatch.setenv("REWARD_API_TOKEN", "")
    monkeypatch.setenv("REWARD_API_MAX_TOKENS", "64")
    s = Settings()
    assert s.executor_urls == ["http://a:8001", "http://b:8001"]
    assert s.stop == ["\n\n", "</s>"]
    assert s.token is None and s.max_tokens == 64 and s.pipeline_enabled


def test_bad_values_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_API_EXECUTOR_URLS", "ftp://x")
    with pytest.raises(ValidationError, match="executor_urls"):
        Settings()
    monkeypatch.delenv("REWARD_API_EXECUTOR_URLS")
    monkeypatch.setenv("REWARD_API_MAX_IN_FLIGHT", "0")
    with pytest.raises(ValidationError, match="max_in_flight"):
        Settings()

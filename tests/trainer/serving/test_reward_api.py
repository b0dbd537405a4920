"""The reward API's environment comes from its typed settings; a local one keeps the caller's
PYTHONPATH; an external one is checked only when the step needs its executor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.reward_api.settings import Settings
from trainer.serving import reward_api
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import SERVED_NAME
from trainer.serving.identity import ServedModel
from trainer.serving.reward_api import reward_api_process, serve_reward_api
from trainer.serving.reward_api_env import env_name, reward_api_env


def test_the_environment_is_built_from_settings_field_names(monkeypatch: pytest.MonkeyPatch) -> None:
    env = reward_api_env(executor_urls=["http://a:1", "http://b:2/v1"], max_tokens=384, check_prompt_length=False,
                         stop=["\n\n", "a,b"], token=None)  # fmt: skip
    assert env == {
        env_name("executor_urls"): "http://a:1,http://b:2/v1",
        env_name("max_tokens"): "384",
        env_name("check_prompt_length"): "false",
        env_name("stop"): '["\\n\\n", "a,b"]',  # an item with a comma: JSON, which the settings also read
        env_name("token"): "",
    }
    for key, value in env.items():  # what the service reads back from that environment
        monkeypatch.setenv(key, value)
    read = Settings()
    assert read.executor_urls == ["http://a:1", "http://b:2"] and read.stop == ["\n\n", "a,b"]
    assert read.max_tokens == 384 and read.check_prompt_length is False and read.token is None


def test_an_unknown_setting_or_a_bad_value_fails_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match=r"\['max_token'\]: no such fields"):
        reward_api_env(max_token=384)
    with pytest.raises(ValidationError, match="max_tokens"):
        reward_api_env(max_tokens=0)
    with pytest.raises(ValueError, match="no such field"):
        env_name("executor_url")


def test_a_local_reward_api_keeps_the_callers_pythonpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the air-gapped node the wheels live on PYTHONPATH (/tmp/site): the loop's reward_api once lost them."""
    from services.reward_api.process import REPO

    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    api = reward_api_process(tmp_path / "api.log", executors=[Endpoint("http://127.0.0.1:1", SERVED_NAME)],
                             max_tokens=384)  # fmt: skip
    assert api.env["PYTHONPATH"] == os.pathsep.join([str(REPO), "/tmp/site"])
    assert api.env[env_name("executor_urls")] == "http://127.0.0.1:1"
    assert api.env[env_name("executor_model")] == SERVED_NAME and api.env[env_name("max_tokens")] == "384"
    monkeypatch.delenv("PYTHONPATH")
    assert reward_api_process(tmp_path / "api.log").env["PYTHONPATH"] == str(REPO)
    with pytest.raises(ValueError, match="one model name"):
        reward_api_process(tmp_path / "api.log", executors=[Endpoint("http://a", "x"), Endpoint("http://b", "y")])


def test_an_external_reward_api_is_checked_only_when_the_step_needs_its_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[tuple[str, str, str | None]] = []

    def check(url: str, expected: str, what: str, token: str | None = None) -> ServedModel:
        checked.append((url, expected, token))
        return ServedModel(url, "pi2-abc", None, "test", expected, "abc")

    monkeypatch.setattr(reward_api, "check_reward_api_url", check)
    monkeypatch.setenv(env_name("token"), "secret")
    with serve_reward_api(tmp_path / "api.log", external="http://r:8000") as api:
        assert (api.url, api.identity) == ("http://r:8000", None)
    assert checked == []
    with serve_reward_api(tmp_path / "api.log", external="http://r:8000", executor_model="/b2/hf") as api:
        assert api.identity is not None and api.identity.served_name == "pi2-abc"
    assert checked == [("http://r:8000", "/b2/hf", "secret")]

"""The reward API's environment, built from its typed settings (``services/reward_api/settings.py``).

Callers name settings by their field names (``max_tokens=384``); the values are checked by
``Settings`` before any process starts, and the variable names come from its ``env_prefix``, so no
caller spells a ``REWARD_API_*`` variable by hand and a renamed setting fails here, not in a log.

The trainer's side of the same API is named here too: what a user sets to point a GRPO phase at a
reward API (:data:`CLIENT_URL_ENV`, :data:`CLIENT_TOKEN_ENV`), and the launcher's internal names
that carry them into VERL's processes (:data:`TRAINER_URL_ENV`, :data:`TRAINER_TOKEN_ENV`; read by
``trainer/in_verl/reward_batcher.py`` and ``trainer/phases/configs/grpo_base.yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import SecretStr

from services.reward_api.settings import Settings


def env_name(field: str) -> str:
    """The environment variable of one reward API setting."""
    if field not in Settings.model_fields:
        raise ValueError(f"reward API setting {field!r}: no such field in services/reward_api/settings.py")
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return f"{prefix}{field}".upper()


# What a user (or a deploy manifest) sets to point a GRPO phase at a reward API: its base URL
# (``trainer run --reward-url`` wins over it) and the bearer token, the same variable as the service's
# own ``token`` setting (``env_name("token")``; a test holds them equal), so one Secret feeds both sides.
CLIENT_URL_ENV = "REWARD_API_URL"
CLIENT_TOKEN_ENV = "REWARD_API_TOKEN"

# What the launcher (``trainer/phases/launch.py``) hands VERL's processes, beside ``TRAINER_DATA_DIR``,
# ``TRAINER_OUT_DIR``, ...: the URL (``grpo_base.yaml``'s ``reward_kwargs.url``) and, when set, the
# token (read by the reward client in VERL's reward workers, which inherit the environment).
TRAINER_URL_ENV = "TRAINER_REWARD_URL"
TRAINER_TOKEN_ENV = "TRAINER_REWARD_TOKEN"
# Why a token is never a config key or a command-line override (the launcher refuses one:
# trainer/phases/token_overrides.py), and what to do instead.
TOKEN_IN_CONFIG = (
    f"set the reward API token in the environment instead (${CLIENT_TOKEN_ENV}; `trainer run` passes it to VERL's "
    f"processes as ${TRAINER_TOKEN_ENV}): an override is written to command.sh, phase_result.json, run.json and "
    "VERL's config dump in train.log"
)


def trainer_reward_env(url: str, token: str | None) -> dict[str, str]:
    """The launcher's reward variables for VERL's processes: the URL, and the token when there is one."""
    env = {TRAINER_URL_ENV: url}
    if token:
        env[TRAINER_TOKEN_ENV] = token
    return env


def _env_value(value: Any) -> str:
    if value is None:
        return ""  # an empty variable is "not set" to the settings
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, Iterable):
        items = [str(v) for v in value]
        # the settings read a list as comma-separated text, or as JSON when an item holds a comma
        return json.dumps(items) if any("," in v for v in items) else ",".join(items)
    return str(value)


def reward_api_env(**settings: Any) -> dict[str, str]:
    """The environment variables that give a reward API these settings (field name → value)."""
    unknown = sorted(set(settings) - set(Settings.model_fields))
    if unknown:
        raise ValueError(f"reward API settings {unknown}: no such fields in services/reward_api/settings.py")
    Settings.model_validate(settings)  # a bad value fails here, with the field's name
    return {env_name(field): _env_value(value) for field, value in settings.items()}

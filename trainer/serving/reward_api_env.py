"""The reward API's environment, built from its typed settings (``services/reward_api/settings.py``).

Callers name settings by their field names (``max_tokens=384``); the values are checked by
``Settings`` before any process starts, and the variable names come from its ``env_prefix``, so no
caller spells a ``REWARD_API_*`` variable by hand and a renamed setting fails here, not in a log.
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

"""No reward API token in a Hydra override: a phase's overrides are written to ``command.sh``,
``phase_result.json``, the run record and VERL's config dump in ``train.log``, so a token set there is written
with them. The token comes from the environment only (the user's token variable,
:data:`trainer.serving.reward_api_env.CLIENT_TOKEN_ENV`, passed to VERL's processes as ``TRAINER_REWARD_TOKEN``).

Each override is read with Hydra's own parser, in every form it accepts (``key=``, ``+key=``, ``++key=``,
``~key``, ``group@package=``, sweeps, dict and list values, quoted strings), and flattened into the key paths it
sets: the override's key (and package) followed by the keys of its value's dicts, a string value under
``reward_kwargs`` read as YAML/JSON too (the reward client parses its ``*_config`` strings as JSON). An override
sets a token when one of those paths has a ``reward_kwargs`` segment followed by a ``token`` (or ``*_token``)
segment, in any case. An override Hydra cannot parse (Hydra would refuse it too) is refused when its text names
both. The error names the override's place and key path, never its value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from trainer.serving.reward_api_env import TOKEN_IN_CONFIG

REWARD_KWARGS = "reward_kwargs"
_TOKEN_TEXT = re.compile(r"token(?!s|izer)", re.IGNORECASE)


class TokenInOverrideError(ValueError):
    """An override sets a reward API token (its message names the override's place and key, not its value)."""


def is_token_key(segment: str) -> bool:
    name = segment.strip().strip("'\"").lower()
    return name == "token" or name.endswith(("_token", "-token"))


def _segments(key: str) -> list[str]:
    return [s for s in re.split(r"[./]", key) if s]


def _read_string(value: str) -> Any:
    """A string value read as YAML (JSON included), or the string where it is none."""
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _paths(prefix: list[str], value: Any) -> Iterator[list[str]]:
    """``prefix`` and every key path below it in ``value`` (dicts by key, lists by index)."""
    yield prefix
    if isinstance(value, str) and any(s.lower() == REWARD_KWARGS for s in prefix):
        parsed = _read_string(value)
        if isinstance(parsed, dict | list):
            yield from _paths(prefix, parsed)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _paths([*prefix, *_segments(str(k))], v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _paths([*prefix, str(i)], v)


def token_path(path: Sequence[str]) -> bool:
    """Whether ``path`` names a token under ``reward_kwargs``."""
    lowered = [s.lower() for s in path]
    if REWARD_KWARGS not in lowered:
        return False
    return any(is_token_key(s) for s in path[lowered.index(REWARD_KWARGS) + 1 :])


def token_key(override: str) -> str | None:
    """The key path by which ``override`` sets a token under ``reward_kwargs`` (None: it sets none)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        if REWARD_KWARGS in override.lower() and _TOKEN_TEXT.search(override.lower().split(REWARD_KWARGS, 1)[1]):
            return "(an override Hydra cannot parse, naming reward_kwargs and a token)"
        return None
    key = [*_segments(parsed.key_or_group), *_segments(parsed.package or "")]
    value = parsed.value()
    values = value.list if isinstance(value, ChoiceSweep) else [value]
    for v in values:
        for path in _paths(key, v):
            if token_path(path):
                return ".".join(path)
    return None


def check_no_token(overrides: Sequence[str], where: str) -> None:
    """:class:`TokenInOverrideError` (one line: ``where``, the override's place and key path) when an override
    sets a reward API token."""
    for i, override in enumerate(overrides, 1):
        found = token_key(override)
        if found is not None:
            raise TokenInOverrideError(
                f"{where}: override {i} of {len(overrides)} sets a reward API token ({found}); {TOKEN_IN_CONFIG}"
            )

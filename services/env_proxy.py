"""The proxy the environment names for a URL, read once per target by the aiohttp clients (reward_api's
executor client, the trainer's generation client): aiohttp's ``trust_env`` would look it up (and read
``~/.netrc``) on every request, in a thread."""

from __future__ import annotations

import urllib.parse
import urllib.request


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url``: ``HTTP(S)_PROXY`` unless ``NO_PROXY`` covers its host
    (the standard library's reading of them, as httpx's default did)."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)

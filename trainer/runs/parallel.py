"""Waiting on work that runs side by side (phases, stages, Phase D's settings)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any


def first_error(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first error after all have ended."""
    errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc

"""SIGTERM stops a trainer program the way Ctrl-C does: whatever it started stops with it.

Slurm and Kubernetes end a job with SIGTERM. Python's default is to die on the spot, and the servers
it started live on (each runs in a session of its own), holding their GPU. The entry points
(``python -m trainer``, the smokes, ``python -m bench``) call :func:`exit_on_sigterm` first: the
handler SIGTERMs every owned child (:func:`services.child_process.terminate_all`, so that a worker
thread blocked on its own child wakes up) and raises ``SystemExit(143)`` in the main thread, so every
``with`` block and ``finally`` runs and stops and reaps what it started. A second SIGTERM during that
cleanup is ignored; SIGKILL still leaves nothing behind on Linux (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import signal
from types import FrameType

from services.child_process import terminate_all


def _during_cleanup(_signum: int, _frame: FrameType | None) -> None:
    """Ignore a repeated SIGTERM (a Python handler, not SIG_IGN: children started now must not inherit it)."""


def _stop(signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, _during_cleanup)
    terminate_all()
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread (call it from the main thread)."""
    signal.signal(signal.SIGTERM, _stop)

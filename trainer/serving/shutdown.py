"""SIGTERM stops a trainer program the way Ctrl-C does: whatever it started stops with it.

Slurm and Kubernetes end a job with SIGTERM. Python's default is to die on the spot, and the servers
it started live on (each runs in a session of its own), holding their GPU. The entry points
(``python -m trainer``, the smokes, ``python -m bench``) call :func:`exit_on_sigterm` first: the
handler SIGTERMs every owned child (:func:`services.child_process.terminate_all`, so that a worker
thread blocked on its own child wakes up) and raises ``SystemExit(143)`` in the main thread, so every
``with`` block and ``finally`` runs and stops and reaps what it started. A second SIGTERM during that
cleanup is ignored; SIGKILL still leaves nothing behind on Linux (``PR_SET_PDEATHSIG``).

A signal that arrives while the main thread forks (starting a phase, a server) is handled inside the
interpreter's at-fork callbacks (``logging`` unlocks its lock there), where Python reports an exception
as "ignored" and carries on: the program would then keep working as if never asked to stop. So while a
fork's callbacks run, the handler only notes the signal, and it is delivered again to the main thread
once they are done.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

from services.child_process import terminate_all

_forking = threading.Event()  # set while the at-fork callbacks registered before ours run
_pending = threading.Event()  # a SIGTERM arrived during them: deliver it again after


def _during_cleanup(_signum: int, _frame: FrameType | None) -> None:
    """Ignore a repeated SIGTERM (a Python handler, not SIG_IGN: children started now must not inherit it)."""


def _redeliver() -> None:
    """Send the noted SIGTERM to the main thread again once the fork's callbacks are done."""
    while _forking.is_set():
        time.sleep(0.001)
    _pending.clear()  # a redelivery that lands in the next fork's callbacks is noted and delivered again
    main = threading.main_thread().ident
    if main is not None:
        signal.pthread_kill(main, signal.SIGTERM)


def _stop(signum: int, _frame: FrameType | None) -> None:
    if _forking.is_set():  # an exception raised here would be swallowed: note it, deliver it again
        if not _pending.is_set():
            _pending.set()
            threading.Thread(target=_redeliver, name="sigterm-redeliver", daemon=True).start()
        return
    signal.signal(signal.SIGTERM, _during_cleanup)
    terminate_all()
    raise SystemExit(128 + signum)


def _before_fork() -> None:
    _forking.set()


def _after_fork_in_parent() -> None:
    _forking.clear()


def _after_fork_in_child() -> None:
    _forking.clear()
    _pending.clear()


_registered = False


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread (call it from the main thread)."""
    global _registered
    if not _registered:
        # before-callbacks run in reverse order of registration, after-callbacks in order: registered after
        # logging's (imported by now), ours bracket its lock's locking and unlocking around every fork
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)  # fmt: skip
        _registered = True
    signal.signal(signal.SIGTERM, _stop)

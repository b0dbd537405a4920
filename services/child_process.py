"""Server processes we own: each in a session of its own, and gone when its owner is gone.

Policy (every server the repository starts locally, executor or reward API, follows it):

- A child runs in a new session, so its process group is exactly its tree: :func:`stop_group` ends
  vLLM's engine core and uvicorn's workers with it, and a Ctrl-C in the terminal reaches only us.
- On Linux it also gets ``PR_SET_PDEATHSIG`` = SIGTERM: when the *thread* that started it ends (the
  owner was SIGKILLed, or crashed past its ``finally``), the kernel stops the child. So the thread that
  starts a server must outlive it; start servers in the thread that will stop them.
- Every owned child is remembered until it is reaped, so a SIGTERM handler can stop all of them at once
  (:func:`terminate_all`) before the owner unwinds: a thread blocked on its child wakes up instead of
  waiting out a training run. ``trainer.serving.shutdown`` installs that handler in the entry points.
- ``die_with_parent=False`` is for a server meant to outlive the command that started it (a GPU
  node's ``python -m trainer serve start``); it is neither signalled on the owner's death nor remembered.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1

_owned: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()
_owned_lock = threading.Lock()


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved before any fork (a forked child must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_PRCTL = _prctl()


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel for SIGTERM when the starting thread ends (Linux), else None.

    It runs in the forked child before ``exec``, so it only calls what was prepared here. If the parent
    is already gone when it runs, no signal would ever come: the child ends itself.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent, sig = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def spawn(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: IO[bytes] | int | None,
    cwd: str | Path | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as an owned child (see the module's policy); stderr goes where stdout goes."""
    preexec = pdeathsig_preexec() if die_with_parent else None
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec,  # prepared before the fork: one prctl call, nothing else
    )
    if die_with_parent:
        with _owned_lock:
            _owned.add(proc)
    return proc


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL after ``grace`` seconds; reaps it. A leader that is gone
    already (a ``kill -9`` of vLLM's API server) may have left its group behind (vLLM's engine core, ~700 MB):
    those are ended too, within ``grace``."""
    if proc.poll() is not None:
        _end_orphans(proc.pid, grace)
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        proc.wait(timeout=10)


def _end_orphans(pgid: int, grace: float) -> None:
    """SIGTERM what is left of a process group whose leader we reaped, SIGKILL after ``grace`` seconds. The
    group's ID stays reserved while any member lives, so the signal reaches only that group."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # nothing left
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _live_members(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _live_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are not zombies (a zombie waits for a parent that may never reap
    it, e.g. a container's PID 1), read from /proc."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry.name))
    return live


def terminate_all() -> list[int]:
    """SIGTERM the process group of every owned child still running (no waiting); their PIDs.

    Safe in a signal handler: it never blocks on a lock another thread may hold forever, and a child
    that was reaped already is skipped (its PID may belong to someone else by now).
    """
    if not _owned_lock.acquire(timeout=1.0):
        return []
    try:
        procs = list(_owned)
    finally:
        _owned_lock.release()
    signalled = []
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
                signalled.append(proc.pid)
    return signalled

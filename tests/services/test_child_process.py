"""Owned server processes: a session of their own, gone with their owner (even a SIGKILLed one), and
all reachable by one call when the owner is told to stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import psutil
import pytest

from services import child_process
from services.child_process import spawn, stop_group, terminate_all

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from services.child_process import spawn
    child = spawn(["sleep", "120"], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL,
                  die_with_parent=sys.argv[1] == "owned")
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("mode", ["owned", "detached"])
def test_an_owned_child_dies_with_its_sigkilled_owner_and_a_detached_one_does_not(mode: str) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    try:
        assert os.getsid(child) == child  # a session (and process group) of its own
        owner.kill()  # no cleanup can run: only the kernel can stop the child now
        owner.wait(timeout=10)
        assert _gone(child, 5.0 if mode == "owned" else 1.0) == (mode == "owned")
    finally:
        owner.kill()
        owner.wait(timeout=10)
        if not _gone(child, 0.0):
            os.killpg(child, signal.SIGKILL)  # the detached one, started by this test


def test_terminate_all_signals_every_owned_child_still_running(monkeypatch: pytest.MonkeyPatch) -> None:
    # A registry of this test's own: terminate_all() in the pytest process would otherwise SIGTERM every
    # server the session owns (the shared vLLM-CPU executor of the `cpu_executor` fixture: five later
    # tests then failed with ConnectError in make test).
    monkeypatch.setattr(child_process, "_owned", weakref.WeakSet())
    kept = spawn(["sleep", "120"], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL)
    detached = spawn(["sleep", "120"], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL, die_with_parent=False)
    try:
        signalled = terminate_all()
        assert kept.pid in signalled and detached.pid not in signalled
        assert kept.wait(timeout=10) == -signal.SIGTERM
        assert detached.poll() is None
    finally:
        stop_group(kept, 5)
        stop_group(detached, 5)
    assert detached.returncode == -signal.SIGTERM


def test_stop_group_ends_what_a_killed_leader_left_behind() -> None:
    """``kill -9`` of a server's leader (vLLM's API server) leaves its group's other processes (the engine
    core) running; stopping the server ends them too."""
    leader = spawn(["bash", "-c", "sleep 120 & echo $!; wait"], env={"PATH": "/usr/bin:/bin"},
                   stdout=subprocess.PIPE, die_with_parent=True)  # fmt: skip
    assert leader.stdout is not None
    orphan = int(leader.stdout.readline())
    try:
        assert os.getpgid(orphan) == leader.pid
        leader.kill()
        leader.wait(timeout=10)
        assert not _gone(orphan, 0.5)  # the leader is gone, its child is not
        t0 = time.monotonic()
        stop_group(leader, 5)
        assert _gone(orphan, 2.0) and time.monotonic() - t0 < 5
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)

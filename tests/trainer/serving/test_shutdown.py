"""SIGTERM to a program that called exit_on_sigterm: its ``finally`` blocks run, its servers stop, exit 143."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PROGRAM = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from pathlib import Path
    from services.child_process import spawn, stop_group
    from trainer.serving.shutdown import exit_on_sigterm

    exit_on_sigterm()
    env = {"PATH": "/usr/bin:/bin"}
    # one server owned by the main thread, one by a worker thread that waits on it (as a phase beside
    # another does on a GPU node): both must stop, the worker's without any help from the main thread
    main_child = spawn(["sleep", "120"], env=env, stdout=subprocess.DEVNULL)
    worker_child = spawn(["sleep", "120"], env=env, stdout=subprocess.DEVNULL)
    worker = threading.Thread(target=worker_child.wait)
    worker.start()
    try:
        print(main_child.pid, worker_child.pid, flush=True)
        time.sleep(120)
    finally:
        stop_group(main_child, 10)
        worker.join(timeout=10)
        Path(sys.argv[1]).write_text(f"cleaned up, worker alive: {worker.is_alive()}")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups as on the Linux hosts")
def test_sigterm_runs_the_cleanup_and_stops_every_owned_server(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    prog = subprocess.Popen([sys.executable, "-c", PROGRAM, str(marker)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert prog.stdout is not None
    children = [int(p) for p in prog.stdout.readline().split()]
    try:
        prog.send_signal(signal.SIGTERM)
        assert prog.wait(timeout=30) == 128 + signal.SIGTERM
        assert marker.read_text() == "cleaned up, worker alive: False"
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)
    finally:
        prog.kill()
        prog.wait(timeout=10)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):  # only if the test failed: servers it started
                os.killpg(pid, signal.SIGKILL)


FORKING = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path

    # a slow at-fork callback, registered before the handler's: a SIGTERM sent now most likely arrives while
    # the interpreter runs it (0.3 s of each 0.35 s), where an exception is reported as "ignored" and the
    # program goes on
    os.register_at_fork(after_in_parent=lambda: time.sleep(0.3))
    from trainer.serving.shutdown import exit_on_sigterm

    exit_on_sigterm()
    try:
        print("ready", flush=True)
        for _ in range(600):  # with a preexec_fn, as services.child_process.spawn starts every child
            subprocess.run(["true"], check=True, preexec_fn=lambda: None)
            time.sleep(0.05)
    finally:
        Path(sys.argv[1]).write_text("cleaned up")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="at-fork callbacks as on the Linux hosts")
def test_sigterm_while_forking_still_stops_the_program(tmp_path: Path) -> None:
    """A SIGTERM that lands in an at-fork callback is delivered again after it: the program stops with 143
    and runs its cleanup, instead of going on with its work."""
    marker = tmp_path / "cleaned"
    prog = subprocess.Popen(
        [sys.executable, "-c", FORKING, str(marker)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    assert prog.stdout is not None and prog.stdout.readline().strip() == "ready"
    try:
        for _ in range(3):  # three signals, most likely each while a fork's callback sleeps; the first must do
            time.sleep(0.1)  # into the forking loop
            prog.send_signal(signal.SIGTERM)
            try:
                code = prog.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            pytest.fail("three SIGTERMs did not stop a program that forks")
        _, err = prog.communicate(timeout=10)
        assert code == 128 + signal.SIGTERM, err
        assert "Exception ignored" not in err, err
        assert marker.read_text() == "cleaned up"
    finally:
        prog.kill()
        prog.wait(timeout=10)

"""SIGTERM to a program that called exit_on_sigterm: its ``finally`` blocks run, its servers stop, exit 143."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
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

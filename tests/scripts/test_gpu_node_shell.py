"""The GPU node's shell scripts (scripts/gpu_node/*.sh) parse; what they do is tested where it can run
without a GPU (tests/scripts/test_gpu_node_job.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts" / "gpu_node").glob("*.sh"))


def test_the_node_scripts_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"job.sh", "node_setup.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_parses(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr

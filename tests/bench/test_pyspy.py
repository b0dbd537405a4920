"""py-spy's collapsed stacks summed per process role (bench/pyspy.py), and rl-step's report section from them."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bench import pyspy

RAW = [
    'process 10:"bash job.sh";process 11:"ray::AgentLoopWorkerTQ";Thread.run (threading.py:1);'
    "AgentLoopWorker._run_agent_loop (/x/verl/agent_loop.py:40);AgentLoopWorker._compute_score (/x/agent_loop.py:9) 30",
    'process 10:"bash job.sh";process 12:"ray::AgentLoopWorkerTQ";Thread.run (threading.py:1);'
    "AgentLoopWorker._run_agent_loop (/x/verl/agent_loop.py:40);tokenize (/x/tok.py:3) 20",
    'process 10:"bash job.sh";process 13:"VLLM::EngineCore";EngineCore.step (/v/core.py:5) 25',
    "garbage line without a count",
]


def test_active_seconds_per_role_and_its_heaviest_frames() -> None:
    s = pyspy.summarize(RAW, window_s=10, rate_hz=10)
    agents, engine = s["roles"]
    assert agents["role"] == "ray::AgentLoopWorkerTQ" and agents["processes"] == 2 and agents["active_s"] == 5.0
    assert agents["active_share_per_process"] == 0.25  # 5 s over 2 processes x 10 s
    assert agents["top"][0] == {"frame": "AgentLoopWorker._run_agent_loop (agent_loop.py)", "s": 5.0}
    assert {"frame": "AgentLoopWorker._compute_score (agent_loop.py)", "s": 3.0} in agents["top"]
    assert all(not t["frame"].startswith("Thread.") for t in agents["top"])  # plumbing left out
    assert engine == {"role": "VLLM::EngineCore", "processes": 1, "active_s": 2.5, "active_share_per_process": 0.25,
                      "top": [{"frame": "EngineCore.step (core.py)", "s": 2.5}]}  # fmt: skip


@pytest.mark.parametrize("name", ["pyspy.txt", "pyspy.txt.gz"])
def test_rl_step_reads_a_runs_profile(tmp_path: Path, name: str) -> None:
    from bench import rl_step

    text = "\n".join(RAW) + "\n"
    if name.endswith(".gz"):
        (tmp_path / name).write_bytes(gzip.compress(text.encode()))
    else:
        (tmp_path / name).write_text(text)
    (tmp_path / "pyspy.log").write_text("py-spy> Sampling process 10 times a second for 10 seconds.\n")
    prof = rl_step.run_profile(tmp_path)
    assert prof is not None and prof["window_s"] == 10 and prof["roles"][0]["active_s"] == 5.0
    assert "| ray::AgentLoopWorkerTQ | 2 | 5.0 | 0.25 |" in pyspy.markdown(prof, "b1_fast")
    assert rl_step.run_profile(tmp_path / "elsewhere") is None

"""The reward_api CPU-cost bench without vLLM: the py-spy summary, the CPU reading and the report."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil

from bench import pipeline_cpu_cost as pc
from bench.common import REPO

_UVI = 'process 1:"python -m services.reward_api";run (uvicorn/main.py:1)'
_POST = f"_post ({REPO}/services/reward_api/executor_client.py:9)"
RAW = "\n".join(
    [
        f"{_UVI};{_POST};is_idle (/x/site-packages/httpcore/_async/http11.py:289) 30",
        f"{_UVI};{_POST} 10",
        "thread 0x1;_worker (/usr/lib/python3.11/concurrent/futures/thread.py:81);"
        "compute (/tmp/cpu-cost-before-abc/shared/rewards.py:5) 10",
        "garbage line",
    ]
)


def test_summary_counts_own_inclusive_and_libraries() -> None:
    s = pc.summarise(RAW)
    assert s["samples"] == 50
    own = {r["function"]: r["samples"] for r in s["by_own"]}
    assert own["is_idle (httpcore/_async/http11.py:289)"] == 30
    assert own["_post (services/reward_api/executor_client.py:9)"] == 10
    assert own["compute (shared/rewards.py:5)"] == 10
    incl = {r["function"]: r["samples"] for r in s["by_inclusive"]}
    assert incl["_post (services/reward_api/executor_client.py:9)"] == 40
    assert incl["run (uvicorn/main.py:1)"] == 40
    libs = {r["library"]: r["share"] for r in s["by_library"]}
    assert libs == {"httpx/httpcore (executor client)": 0.6, "reward_api (project)": 0.2, "shared (project)": 0.2}


def test_cpu_seconds_include_child_processes() -> None:
    # A child that burns 0.5 s of CPU, says so, and waits: the parent's tree reading includes it.
    burn = "import sys, time\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\nsys.stdin.read()"
    child = subprocess.Popen(["python3", "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        mine = sum(psutil.Process().cpu_times()[:2])
        assert pc.cpu_seconds(os.getpid()) >= mine + 0.45
    finally:
        child.communicate("", timeout=10)


def test_report_has_both_services_and_the_ratio() -> None:
    prof = {**pc.summarise(RAW), "cpu_ms_per_item_under_profiler": 2.0}
    variant = {
        "cpu_ms_per_item": [4.0, 4.2],
        "median_cpu_ms_per_item": 4.1,
        "wall_seconds": [10.0, 11.0],
        "executor_calls": [64, 64],
        "profile": prof,
    }
    payload = {
        "run": {
            "timestamp": "t", "command": "python -m bench pipeline-cpu-cost", "quick": False, "noisy": False,
            "loadavg_1m_at_start": 0.1, "machine": {"cpu": "c", "cores": 2, "ram_gib": 1.0},
            "versions": {"python": "3.11", "vllm": "0.32", "fastapi": "f", "uvicorn": "u", "project_commit": "x"},
        },
        "model": "m", "executor_url": "u", "workers": 1, "max_in_flight": 256, "items": 64, "clients": 4,
        "batch": 16, "rounds": 2, "max_tokens": 8,
        "variants": [
            {**variant, "label": "before", "code": "a" * 40},
            {**variant, "label": "after", "code": "working tree", "median_cpu_ms_per_item": 2.05},
        ],
    }  # fmt: skip
    md = pc.render_md(payload)
    assert "before / after: **2.00×**" in md
    assert "### Top 20 by own samples" in md and "is_idle (httpcore/_async/http11.py:289)" in md
    assert md.count("## Profile") == 2


def test_checkout_of_the_working_tree_is_the_repo() -> None:
    with pc.checkout(None) as (code, folder):
        assert code == "working tree" and folder == Path(REPO)

"""The split of a PyTorch profiler trace into named regions, GPU busy time and heaviest operators
(bench/torch_trace.py), on a trace PyTorch writes here and on hand-made events with known overlaps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from typer.testing import CliRunner

from bench import torch_trace
from bench.__main__ import app


def _event(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_regions_gpu_busy_union_and_top_level_cpu_ops() -> None:
    events = [
        _event("mini_batch0", "user_annotation", 0, 1_000_000),
        _event("mini_batch1", "user_annotation", 1_000_000, 1_000_000),
        # two overlapping kernels in the first mini batch (union 0.3 s), one in the second (0.1 s)
        _event("gemm", "kernel", 100_000, 200_000, tid=7),
        _event("gemm", "kernel", 200_000, 200_000, tid=8),
        _event("softmax", "kernel", 1_500_000, 100_000, tid=7),
        # aten::linear holds aten::mm: only the outer one counts as top level
        _event("aten::linear", "cpu_op", 0, 500_000),
        _event("aten::mm", "cpu_op", 10_000, 400_000),
        _event("aten::item", "cpu_op", 1_200_000, 300_000),
    ]
    s = torch_trace.split(events)
    assert s["span_s"] == pytest.approx(2.0) and s["gpu_busy_s"] == pytest.approx(0.4)
    mb = s["regions"]["mini_batch"]
    assert mb["count"] == 2 and mb["wall_s"] == pytest.approx(2.0) and mb["gpu_busy_s"] == pytest.approx(0.4)
    assert mb["gpu_share"] == pytest.approx(0.2)
    ops = {o["name"]: o for o in s["cpu_ops"]}
    assert set(ops) == {"aten::linear", "aten::item"} and ops["aten::linear"]["total_s"] == pytest.approx(0.5)
    assert s["gpu_kernels"][0] == {"name": "gemm", "calls": 2, "total_s": pytest.approx(0.4)}
    md = torch_trace.markdown(s, "w")
    assert "| mini_batch | 2 | 2.000 | 0.400 | 0.20 |" in md


def test_a_trace_written_by_pytorch_is_read_from_gzip(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"micro_batch{i}"):
                model(torch.randn(32, 64)).sum().backward()
    raw = tmp_path / "w.json"
    prof.export_chrome_trace(str(raw))
    gz = tmp_path / "w.json.gz"
    gz.write_bytes(gzip.compress(raw.read_bytes()))
    out = tmp_path / "split.json"
    result = CliRunner().invoke(app, ["torch-trace", str(gz), "--out", str(out)])
    assert result.exit_code == 0, result.output
    s = json.loads(out.read_text())
    assert s["regions"]["micro_batch"]["count"] == 2 and s["regions"]["micro_batch"]["wall_s"] > 0
    assert s["gpu_busy_s"] == 0 and any(o["name"].startswith("aten::") for o in s["cpu_ops"])


def test_an_empty_trace_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "empty.json"
    f.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="no complete events"):
        torch_trace.split(torch_trace.load_events(f))


def test_the_hosts_waits_are_counted_per_region_and_site() -> None:
    """A blocking runtime call is attributed to the operator and the caller outside PyTorch around it, and to its
    innermost region; a kernel launch is not a wait, and a wait on another thread has its own stack."""
    events = [
        _event("micro_batch0", "user_annotation", 0, 1_000_000),
        _event("micro_batch1", "user_annotation", 1_000_000, 1_000_000),
        _event("verl/workers/utils/losses.py(57): ppo_loss", "python_function", 0, 900_000),
        _event("torch/_tensor.py(10): item", "python_function", 100_000, 300_000),
        _event("aten::item", "cpu_op", 110_000, 250_000),
        _event("aten::_local_scalar_dense", "cpu_op", 120_000, 200_000),
        _event("cudaStreamSynchronize", "cuda_runtime", 130_000, 150_000),
        _event("cudaLaunchKernel", "cuda_runtime", 500_000, 10_000),
        _event("trainer/in_verl/nested_batches.py(99): select_rows", "python_function", 1_100_000, 500_000),
        _event("aten::to", "cpu_op", 1_200_000, 100_000),
        _event("cudaStreamSynchronize", "cuda_runtime", 1_210_000, 50_000),
        _event("cudaDeviceSynchronize", "cuda_runtime", 1_500_000, 20_000, tid=2),  # no stack on its thread
    ]
    s = torch_trace.split(events)["syncs"]
    assert s["calls"] == 3 and s["wait_s"] == pytest.approx(0.22)
    assert s["regions"] == {
        "micro_batch": {"calls": 2, "wait_s": pytest.approx(0.2)},
        "(none)": {"calls": 1, "wait_s": pytest.approx(0.02)},
    }
    sites = {(o["op"], o["frame"]): (o["calls"], o["wait_s"]) for o in s["sites"]}
    assert sites == {
        ("aten::_local_scalar_dense", "verl/workers/utils/losses.py(57): ppo_loss"): (1, pytest.approx(0.15)),
        ("aten::to", "trainer/in_verl/nested_batches.py(99): select_rows"): (1, pytest.approx(0.05)),
        ("", ""): (1, pytest.approx(0.02)),
    }
    md = torch_trace.markdown(torch_trace.split(events), "w")
    assert "The host waited for the card 3 times, 0.220 s in all." in md
    assert "| `aten::_local_scalar_dense` | `verl/workers/utils/losses.py(57): ppo_loss` | 1 | 0.150 |" in md

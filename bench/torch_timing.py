"""A small PyTorch workload timed in this process and its operators counted: the shared core of the
benchmarks that set one of VERL's functions against this project's (bench/response_padding.py,
bench/nested_batches.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def timed_and_counted(
    work: Callable[[], None], device: str, repeats: int, counted: Mapping[str, str], digits: int = 5
) -> dict[str, Any]:
    """``work`` once to warm up, ``repeats`` times timed (the device synchronised after each), once under PyTorch's
    profiler: the median and each time, and the calls of each operator ``counted`` names (key -> operator)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def once() -> None:
        work()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    once()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        once()
    ops = {e.key: e.count for e in prof.key_averages()}
    out: dict[str, Any] = {"median_s": round(statistics.median(times), digits)}
    out["times_s"] = [round(t, digits) for t in times]
    out.update({key: ops.get(op, 0) for key, op in counted.items()})
    return out

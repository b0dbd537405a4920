"""Where a profiled stage's time goes, from PyTorch's chrome trace (VERL's ``global_profiler.tool=torch``).

``python -m bench torch-trace TRACE.json.gz [--out SPLIT.json]`` reads one trace (a worker's profiled step) and
writes a small summary that travels where a trace of tens of MB does not: the traced span, each named region
(VERL's stage and ``mini_batch<i>`` / ``micro_batch<i>`` annotations) with its wall time and the GPU's busy time
inside it (the union of kernel and memcpy intervals), the heaviest top-level CPU operators (those not inside another
operator of their thread) and the heaviest GPU kernels, by total duration.
A region whose GPU busy share is low is bound by the host (Python, launches, synchronisation), not by the card.

Where the host waits for the card: every blocking CUDA runtime call (``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, ``cudaEventSynchronize``) is counted with the seconds it blocked, per region and per site:
the innermost PyTorch operator that made it (``aten::item``, ``aten::nonzero``, ``aten::to`` …) and, when the trace
holds Python stacks (the profiler's ``stack`` content), the innermost frame outside PyTorch that called it. A host
that waits at every micro batch cannot run ahead of the card: each wait drains the queue, and the card then idles
while Python prepares the next kernels.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# the per-index annotations are summed by kind (mini_batch0..7 -> mini_batch)
_INDEXED = re.compile(r"^(mini_batch|micro_batch)\d+$")
# FSDP's per-module annotations are summed over the layers (``FSDP::pre_forward (model.layers.12)``)
_LAYER = re.compile(r"\.layers\.\d+\)$")
REGIONS = 20  # the longest regions kept
# CUDA runtime calls that block the host until the card has finished (the driver API's names too)
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)
_TORCH_FRAME = re.compile(r"(^|/)torch/|^<built-in")


def load_events(path: Path) -> list[dict[str, Any]]:
    """The complete ('X') events of a chrome trace file (gzip or plain JSON)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _region(name: str) -> str:
    """An annotation's name with its index or layer number summed away (``micro_batch3`` -> ``micro_batch``)."""
    return _LAYER.sub(".layers.*)", _INDEXED.sub(r"\1", name))


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total = 0.0
    end = float("-inf")
    for s, e in sorted(intervals):
        if s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def split(events: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
    """The summary of one trace; times in seconds."""
    if not events:
        raise ValueError("the trace holds no complete events")
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("cat") in GPU_CATS]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    notes = [e for e in events if e.get("cat") == "user_annotation"]
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    regions: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "wall_s": 0.0, "gpu_busy_s": 0.0})
    for e in notes:
        name = _region(str(e["name"]))
        lo, hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        r = regions[name]
        r["count"] += 1
        r["wall_s"] += (hi - lo) / 1e6
        r["gpu_busy_s"] += _union_us(_clip(gpu, lo, hi)) / 1e6
    for r in regions.values():
        r["wall_s"], r["gpu_busy_s"] = round(r["wall_s"], 4), round(r["gpu_busy_s"], 4)
        r["gpu_share"] = round(r["gpu_busy_s"] / r["wall_s"], 3) if r["wall_s"] else 0.0

    def heaviest(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for e in evs:
            b = by[str(e["name"])]
            b[0] += 1
            b[1] += float(e["dur"])
        rows = sorted(by.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
        return [{"name": k[:120], "calls": int(v[0]), "total_s": round(v[1] / 1e6, 4)} for k, v in rows]

    return {
        "span_s": round((end - start) / 1e6, 4),
        "gpu_busy_s": round(_union_us(gpu) / 1e6, 4),
        "regions": dict(sorted(regions.items(), key=lambda kv: kv[1]["wall_s"], reverse=True)[:REGIONS]),
        "cpu_ops": heaviest(_top_level(cpu_ops)),
        "gpu_kernels": heaviest([e for e in events if e.get("cat") in GPU_CATS]),
        "syncs": syncs(events, top=top),
    }


def syncs(events: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
    """The host's blocking waits for the card: their count and seconds in all, per region, and per site (the innermost
    operator and the innermost frame outside PyTorch around each wait, on its thread)."""
    by_region: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_site: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    calls, wait_us = 0, 0.0
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver"):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        stack: list[dict[str, Any]] = []
        for e in sorted(evs, key=lambda x: (float(x["ts"]), -float(x["dur"]))):
            while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) <= float(e["ts"]):
                stack.pop()
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in SYNC_CALLS:
                dur = float(e["dur"])
                calls, wait_us = calls + 1, wait_us + dur
                op = next((str(s["name"]) for s in reversed(stack) if s.get("cat") == "cpu_op"), "")
                frame = next(
                    (
                        str(s["name"])
                        for s in reversed(stack)
                        if s.get("cat") == "python_function" and not _TORCH_FRAME.search(str(s["name"]))
                    ),
                    "",
                )
                notes = [s for s in stack if s.get("cat") == "user_annotation"]
                region = _region(str(notes[-1]["name"])) if notes else "(none)"
                for key, table in ((region, by_region), ((op, frame), by_site)):
                    table[key][0] += 1  # type: ignore[index]
                    table[key][1] += dur  # type: ignore[index]
            stack.append(e)
    sites = sorted(by_site.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
    return {
        "calls": calls,
        "wait_s": round(wait_us / 1e6, 4),
        "regions": {k: {"calls": int(v[0]), "wait_s": round(v[1] / 1e6, 4)} for k, v in sorted(by_region.items())},
        "sites": [
            {"op": op, "frame": frame[:160], "calls": int(v[0]), "wait_s": round(v[1] / 1e6, 4)}
            for (op, frame), v in sites
        ],
    }


def _top_level(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CPU operators not inside another operator on the same thread: their durations add up without overlap."""
    out: list[dict[str, Any]] = []
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        end = float("-inf")
        for e in sorted(evs, key=lambda x: (float(x["ts"]), -float(x["dur"]))):
            if float(e["ts"]) >= end:
                out.append(e)
                end = float(e["ts"]) + float(e["dur"])
    return out


def markdown(summary: dict[str, Any], title: str) -> str:
    lines = [
        f"### {title}: {summary['span_s']:.2f} s traced, GPU busy {summary['gpu_busy_s']:.2f} s",
        "",
        "| region | count | wall s | GPU busy s | GPU share |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {k} | {r['count']} | {r['wall_s']:.3f} | {r['gpu_busy_s']:.3f} | {r['gpu_share']:.2f} |"
        for k, r in summary["regions"].items()
    ]
    lines += ["", "| top-level CPU operator | calls | s |", "|---|---|---|"]
    lines += [f"| `{o['name']}` | {o['calls']} | {o['total_s']:.3f} |" for o in summary["cpu_ops"]]
    lines += ["", "| GPU kernel | calls | s |", "|---|---|---|"]
    lines += [f"| `{o['name'][:80]}` | {o['calls']} | {o['total_s']:.3f} |" for o in summary["gpu_kernels"]]
    sync = summary.get("syncs")  # summaries written before the waits were counted have none
    if sync is not None:
        lines += ["", f"The host waited for the card {sync['calls']} times, {sync['wait_s']:.3f} s in all."]
    if sync and sync["calls"]:
        lines += [""]
        lines += ["| region (innermost) | waits | s |", "|---|---|---|"]
        lines += [f"| {k} | {r['calls']} | {r['wait_s']:.3f} |" for k, r in sync["regions"].items()]
        lines += ["", "| operator | caller outside PyTorch | waits | s |", "|---|---|---|---|"]
        lines += [
            f"| `{o['op'] or '-'}` | `{o['frame'] or '-'}` | {o['calls']} | {o['wait_s']:.3f} |" for o in sync["sites"]
        ]
    return "\n".join(lines) + "\n"


def summarise(trace: Path, out: Path | None = None, top: int = 12) -> dict[str, Any]:
    """Split ``trace``; with ``out`` write the summary there as JSON, else print it as Markdown."""
    summary = split(load_events(trace), top=top)
    summary["trace"] = trace.name
    if out:
        out.write_text(json.dumps(summary, indent=1))
    else:
        print(markdown(summary, trace.name))
    return summary

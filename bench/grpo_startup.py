"""Where a GRPO phase's start-up goes, from probe runs: B1 for 2 steps with vLLM's INFO log, each run a
``scripts/gpu_node/job.sh`` job (docs/benchmarks.md, "GRPO start-up", has the commands).

``python -m bench grpo-startup --collected DIR [--notes FILE]`` reads every run of an unpacked
``job.sh collect`` archive (a job NAME whose phase folder ``<path>/NAME/train.log`` came back; its
start and end from ``jobs/stages.tsv``) or of the older ``startup_probe.sh collect`` (run folders with
``start``/``end`` epoch stamps), each ``train.log`` with VERL's and vLLM's INFO lines, and writes
``bench/results/grpo_startup.{json,md}``: the time between the markers that VERL and vLLM log on the
way to the first rollout, per run. The card and versions come from the collected ``card.txt`` and
``versions.json``: the numbers belong to the GPU node, not to the machine that builds the report.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import md_table, write_result

NAME = "grpo_startup"


@dataclass(frozen=True)
class Marker:
    key: str
    pattern: str  # a regex over one log line; the first matching line gives the time
    what: str  # what happened by then (the stage that ENDS at this marker)


# In the order they appear. VERL logs "INFO:YYYY-mm-dd HH:MM:SS,mmm:", vLLM "INFO MM-DD HH:MM:SS", Ray
# "YYYY-mm-dd HH:MM:SS,mmm\tINFO".
MARKERS = (
    Marker("ray_started", r"Started a local Ray instance", "Python, Hydra config and Ray start"),
    Marker("dataloader", r"train and validate dataloader initialized", "TaskRunner actor, transfer queue, datasets"),
    Marker("worker_group", r"create worker group", "resource pool"),
    Marker("actor_ref_ready", r"actor and ref model engine initialized", "FSDP actor + reference workers"),
    # vLLM at WARNING (VERL's default for it) logs no INFO line: its first warnings stand in for the same points
    Marker("vllm_server_up",
           r"Enabling cumem allocator|Resolved architecture|vLLMHttpServer pid=\d+\S* WARNING .*\[vllm\.py",
           "vLLM server actor start + import"),
    Marker("vllm_engine_config", r"Overriding VLLM_WORKER_MULTIPROC_METHOD|Initializing a V1 LLM engine",
           "vLLM engine config"),
    # with vLLM's INFO log (VLLM_LOGGING_LEVEL=INFO) the engine's start splits further: its processes, weights,
    # memory profiling, KV cache and graphs, warm-up
    Marker("vllm_engine_init", r"EngineCore pid=\d+\) INFO .*Initializing a V1 LLM engine",
           "EngineCore process start + import"),
    Marker("vllm_worker_up", r"Injected <class .* into <class 'vllm", "vLLM worker process start + import"),
    Marker("vllm_model_loaded", r"Model loading took", "weights"),
    Marker("vllm_kv_sized", r"Available KV cache memory",
           "vLLM memory profiling (a forward at the batched-token size)"),
    Marker("vllm_graphs", r"Graph capturing finished", "KV cache allocation + CUDA graph capture"),
    Marker("vllm_engine_ready", r"init engine \(profile, create kv cache|EngineCore pid=\d+\) WARNING .*\[vllm\.py",
           "the engine's start not split above (its processes, weights, KV cache, graphs; warm-up)"),
    Marker("rollout_ready", r"ready to fit", "vLLM API up, weight sync"),
    Marker(
        "first_generation",
        r"Continuous Token builder|Passing raw prompts",
        "agent-loop workers start; first prompts sent",
    ),
)
_VERL = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})")
_VLLM = re.compile(r"(?:INFO|WARNING|DEBUG) (\d{2}-\d{2} \d{2}:\d{2}:\d{2})")


def line_time(line: str, year: int) -> float | None:
    """Epoch seconds (UTC) of a VERL, Ray or vLLM log line, None if it has no stamp."""
    m = _VERL.search(line)
    if m:
        stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
        return stamp.timestamp() + int(m.group(2)) / 1000
    m = _VLLM.search(line)
    if m:
        return dt.datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    return None


def markers(log_lines: Sequence[str], year: int) -> dict[str, float]:
    """The first time of each marker in the log (markers that never appear are left out)."""
    found: dict[str, float] = {}
    for line in log_lines:
        for mk in MARKERS:
            if mk.key not in found and re.search(mk.pattern, line):
                t = line_time(line, year)
                if t is not None:
                    found[mk.key] = t
    return found


def stages(start: float, end: float | None, found: dict[str, float]) -> list[dict[str, Any]]:
    """Consecutive intervals between the markers found, from the run's start; then the rest of the run."""
    rows: list[dict[str, Any]] = []
    prev_key, prev_t = "start", start
    for mk in MARKERS:
        if mk.key not in found:
            continue
        t = found[mk.key]
        rows.append({"stage": mk.what, "from": prev_key, "to": mk.key, "seconds": round(t - prev_t, 1)})
        prev_key, prev_t = mk.key, t
    if end is not None:
        rows.append({"stage": "validation, training steps, checkpoint, export", "from": prev_key, "to": "end",
                     "seconds": round(end - prev_t, 1)})  # fmt: skip
    return rows


def read_run(folder: Path) -> dict[str, Any]:
    """A run folder of the older probe archive: ``start``, ``end``, ``run.rc`` and ``train.log``."""
    start = float((folder / "start").read_text())
    end = float((folder / "end").read_text()) if (folder / "end").is_file() else None
    rc = (folder / "run.rc").read_text().strip() if (folder / "run.rc").is_file() else None
    return timed_run(folder.name, start, end, rc, folder / "train.log")


def job_runs(collected: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The finished and the unfinished probe runs of a ``job.sh collect`` archive."""
    from bench.learning_gpu import read_stages

    times = read_stages(collected / "jobs" / "stages.tsv") if (collected / "jobs" / "stages.tsv").is_file() else {}
    runs, unfinished = [], []
    for log in sorted((collected / "jobs").glob("*.log")):
        name = log.stem
        train = next(iter(sorted(collected.glob(f"*/{name}/train.log"))), None)
        if train is None:
            continue  # a job that is no probe run (the reward API, a data build)
        rc = collected / "jobs" / f"{name}.rc"
        if name in times and rc.is_file():
            t = times[name]
            runs.append(timed_run(name, t["start"], t["end"], rc.read_text().strip(), train))
        else:
            unfinished.append(name)
    return runs, unfinished


def timed_run(name: str, start: float, end: float | None, rc: str | None, train_log: Path) -> dict[str, Any]:
    log = train_log.read_text(errors="replace").splitlines() if train_log.is_file() else []
    year = dt.datetime.fromtimestamp(start, dt.UTC).year
    found = markers(log, year)
    rows = stages(start, end, found)
    first = found.get("first_generation")
    ready = reward_ready(train_log.parent, start)
    return {
        "run": name,
        "exit_code": None if rc is None else int(rc),
        "total_seconds": None if end is None else round(end - start, 1),
        "seconds_to_first_generation": None if first is None else round(first - start, 1),
        "markers": {k: round(v - start, 1) for k, v in found.items()},
        "stages": rows,
        "reward_api": ready,
        "steps": step_timings(train_log.parent / "metrics.jsonl"),
    }


def reward_ready(run_dir: Path, start: float) -> dict[str, Any] | None:
    """What the trainer recorded when its reward API was ready (``checkpoints/reward_ready.json``, written
    by ``PhaseTrainer`` before validation step 0): how long it waited, and when that was after the start."""
    path = run_dir / "checkpoints" / "reward_ready.json"
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    return {"waited_s": rec["waited_s"], "ready_after_start_s": round(float(rec["ready_at_unix"]) - start, 1)}


STEP_KEYS = ("timing_s/step", "timing_s/gen", "timing_s/update_actor")


def step_timings(metrics: Path) -> dict[str, float]:
    """Mean seconds of the training steps' parts (VERL's ``timing_s/*``) in the phase's ``metrics.jsonl``."""
    if not metrics.is_file():
        return {}
    rows = [json.loads(line)["data"] for line in metrics.read_text().splitlines() if line.strip()]
    out: dict[str, float] = {}
    for key in STEP_KEYS:
        vals = [float(r[key]) for r in rows if key in r]
        if vals:
            out[key.split("/", 1)[1]] = round(sum(vals) / len(vals), 2)
    return out


def build(collected: Path, notes: str = "") -> dict[str, Any]:
    # a run still going when the node's files were collected has no end: listed, not timed
    runs, unfinished = job_runs(collected)
    folders = [d for d in sorted(collected.iterdir()) if d.is_dir() and (d / "start").is_file()]
    runs += [read_run(d) for d in folders if (d / "end").is_file()]
    unfinished += [d.name for d in folders if not (d / "end").is_file()]
    if not runs and not unfinished:
        raise FileNotFoundError(f"--collected: no probe run (job.sh archive or run folder) under {collected}")
    card = (collected / "card.txt").read_text().strip() if (collected / "card.txt").is_file() else None
    versions = json.loads((collected / "versions.json").read_text()) if (collected / "versions.json").is_file() else {}
    return {
        "benchmark": NAME, "card": card, "versions": versions, "runs": runs, "unfinished": unfinished, "notes": notes,
    }  # fmt: skip


def render_md(p: dict[str, Any]) -> str:
    v = p["versions"]
    md = (
        "# Where a GRPO phase's start-up goes (probe runs of 2 steps, one GPU each)\n\n"
        f"- card: {'; '.join((p['card'] or 'unknown').splitlines())}\n"
        f"- versions: {', '.join(f'{k} {x}' for k, x in v.items())}\n"
        "- command on the node: one `scripts/gpu_node/job.sh` job per run (a GRPO phase from the base model, 2 "
        "steps, validation on 512 prompts; docs/benchmarks.md, and the notes below), then `collect`; "
        "this report: `python -m bench grpo-startup --collected DIR`\n\n"
    )

    def waited(r: dict[str, Any]) -> str:
        ready = r.get("reward_api")
        return "–" if not ready else f"{ready['waited_s']} (ready at +{ready['ready_after_start_s']})"

    def step(r: dict[str, Any]) -> str:
        t = r.get("steps") or {}
        return "–" if "step" not in t else f"{t['step']} (gen {t.get('gen', '–')})"

    md += "## Runs\n\n" + md_table(
        ["run", "exit", "total s", "s to first generation", "waited for reward API s", "step s"],
        [
            [r["run"], r["exit_code"], r["total_seconds"], r["seconds_to_first_generation"], waited(r), step(r)]
            for r in p["runs"]
        ],
    )
    if p.get("unfinished"):
        md += f"\nStill running when collected (not timed): {', '.join(p['unfinished'])}.\n"
    for r in p["runs"]:
        md += f"\n## {r['run']}: stages\n\n" + md_table(
            ["stage", "ends at", "seconds"], [[s["stage"], s["to"], s["seconds"]] for s in r["stages"]]
        )
    return md + (("\n" + p["notes"].strip() + "\n") if p.get("notes") else "")


def run(collected: Path, notes_file: Path | None = None, name: str = NAME) -> dict[str, Any]:
    payload = build(collected, notes_file.read_text() if notes_file else "")
    write_result(name, payload, render_md(payload), quick=False)
    return payload

"""A GRPO step, an SFT epoch and a phase start-up, against the floor and against VERL's own trainer.

``python -m bench rl-step --collected DIR [--collected DIR ...] [--notes FILE]`` reads the runs of unpacked
``scripts/gpu_node/job.sh collect`` archives (``scripts/gpu_node/rl_step.sh`` makes them on a GPU node) and
writes ``bench/results/rl_step.{json,md,png}``.

A run is a job named ``<phase>_<setting>`` (``b1_fast``, ``b1_stock``, ``c1_fast``, ``a1_fast``, ``b1_small`` …; the
setting ``stock`` is VERL's own trainer, :mod:`bench.verl_stock`, reported as ``verl_stock``) whose phase folder
``<path>/<name>/`` came back with ``metrics.jsonl``, ``train.log`` and ``command.sh``; ``runs.json`` (written
by the node script) gives each run's GPUs, and ``gpu_util.csv`` (``nvidia-smi`` every 0.5 s) their use.

What is computed, per GRPO run (VERL's ``timing_s/*`` of each training step; the first step is left out of
the means where later ones exist, since it carries one-off warm-up):

- the step and its split: ``gen`` (generation, with the reward computed as groups finish, and the wait
  for the replay buffer), ``old_log_prob``, ``ref``, ``adv``, ``update_actor``, ``update_weights`` (the
  weight sync to vLLM), and ``other`` (the step less those);
- tokens per step (``perf/total_num_tokens``) and per second;
- the floor: ``8 N T / (peak x GPUs)``: a forward over the step's ``T`` prompt and response tokens to
  generate them (``2 N T``) and one forward and backward to learn from them (``6 N T``) for a policy of
  ``N`` parameters, at the card's dense bf16 peak; the step's time over it is the gap;
- the GPUs' busy share from the first generation to the end of the run (``utilization.gpu``);
- the rollout/actor mismatch where the actor recomputed the old log-probs (``rollout_corr/kl``,
  ``training/rollout_probs_diff_mean``, against ``actor/ppo_kl``);
- seconds from the launch to the first generation (:func:`bench.grpo_startup.timed_run`).

The reward's share of a C1 step is C1's generation time beyond B1's at the same settings, over C1's step
(the reward of B1 is computed in-process in milliseconds; C1's waits for the π2 executor).

Every GRPO run is also a row of ``rows`` (``phase``, ``setting``, ``gpus``, ``batch``, ``n``, ``step_s``,
``split_s``, ``floor_s``, ``startup_s`` and its ``startup_split``); a job ``exec_<name>`` (``trainer serve start
--wait``) gives an executor's ready time; ``targets`` compares the ``fast`` rows with the one-GPU goals
(:data:`TARGETS`), each with its number, and names a miss's largest part.

Per SFT run: the epoch's seconds (``tqdm``'s elapsed time of the training loop, extrapolated to the whole
epoch where a run stopped after ``trainer.total_training_steps``), the job's wall time and the last
validation loss.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import shlex
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, md_table, write_result

NAME = "rl_step"
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
# Dense bf16 peak per GPU (NVIDIA's datasheets, SXM parts, no sparsity)
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12}
SMOLLM2_135M_PARAMS = 134_479_872
# The one-GPU goals (64 x 16): B1 and C1 steps, C1's pipeline reward share, a phase's start to its first
# generation, an executor's ready time, two SFT epochs of A1 and A2 side by side, and B1 against VERL's own.
TARGETS = {"b1_step_s": 6.0, "c1_step_s": 8.0, "c1_reward_share": 0.15, "startup_s": 60.0, "executor_ready_s": 30.0,
           "sft_two_epochs_side_by_side_s": 240.0, "b1_over_verl_stock": 1.0}  # fmt: skip
SETTING_NAMES = {"stock": "verl_stock"}
MET = {True: "yes", False: "**no**", None: "not run"}
_TQDM = re.compile(r"Epoch \d+/\d+:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[(\d+:)?(\d+):(\d+)<")


def _mean(values: Sequence[float]) -> float | None:
    """The mean to 5 significant digits (seconds and token counts as well as KLs of 1e-5)."""
    return float(f"{statistics.fmean(values):.5g}") if values else None


def step_rows(metrics: Path) -> list[dict[str, Any]]:
    """VERL's logged training steps (rows with ``timing_s/step``), in order."""
    if not metrics.is_file():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["data"] for r in rows if "timing_s/step" in r.get("data", {})]


def gpus_of(command: str) -> int:
    """``trainer.n_gpus_per_node`` from a phase's ``command.sh`` (the gpu profile's 8 where not given)."""
    for tok in shlex.split(command):
        if tok.startswith("trainer.n_gpus_per_node="):
            return int(tok.split("=", 1)[1])
    return 8


def profiled_steps(command: str) -> set[int]:
    """The steps VERL's torch profiler traced (``global_profiler.steps=[k, ...]`` in ``command.sh``): their step
    times carry the profiler's cost and are left out of the means."""
    for tok in shlex.split(command):
        if tok.startswith("global_profiler.steps="):
            return {int(x) for x in re.findall(r"\d+", tok.split("=", 1)[1])}
    return set()


def run_trace(folder: Path) -> dict[str, Any] | None:
    """The torch trace's split of a run (``trace_split.json``, from ``python -m bench torch-trace`` on the node)."""
    f = folder / "trace_split.json"
    return json.loads(f.read_text()) if f.is_file() else None


def card_peak(card: str | None) -> float | None:
    for name, peak in PEAK_BF16.items():
        if card and name in card:
            return peak
    return None


def floor_s(tokens: float, gpus: int, peak: float | None, params: int) -> float | None:
    return None if peak is None or not tokens else round(8 * params * tokens / (peak * gpus), 3)


def overlapping_steps(runs: dict[str, tuple[float, Sequence[float]]]) -> dict[str, list[int]]:
    """Runs side by side (name → the epoch of its first generation, its step seconds in order; a step starts where
    the one before ended): the indices of each run's steps that ran wholly while every other run was stepping."""
    spans = {}
    for name, (t0, steps) in runs.items():
        ends = list(itertools.accumulate(steps, initial=t0))
        spans[name] = list(itertools.pairwise(ends))
    if not all(spans.values()):
        return {name: [] for name in runs}
    lo = max(sp[0][0] for sp in spans.values())
    hi = min(sp[-1][1] for sp in spans.values())
    return {name: [i for i, (a, b) in enumerate(sp) if a >= lo and b <= hi] for name, sp in spans.items()}


def grpo_summary(
    rows: list[dict[str, Any]], gpus: int, peak: float | None, params: int, warmup: bool = True
) -> dict[str, Any]:
    """``warmup``: the first row is the engine's warm-up and is left out of the means (when there are others)."""
    steady = rows[1:] if warmup and len(rows) > 1 else rows

    def mean(key: str) -> float | None:
        return _mean([float(r[key]) for r in steady if isinstance(r.get(key), int | float)])

    step = mean("timing_s/step") or 0.0
    split = {s: mean(f"timing_s/{s}") for s in STAGES}
    known = sum(v for v in split.values() if v)
    split["other"] = round(step - known, 3) if step else None
    tokens = mean("perf/total_num_tokens") or 0.0
    return {
        "steps": len(rows),
        "steps_averaged": len(steady),
        "step_s": step if steady else None,
        "first_step_s": round(float(rows[0]["timing_s/step"]), 3) if rows else None,
        "split_s": split,
        "tokens_per_step": tokens,
        "tokens_per_s": round(tokens / step, 1) if step else None,
        "prompt_len": mean("prompt_length/mean"),
        "response_len": mean("response_length/mean"),
        "floor_s": floor_s(tokens, gpus, peak, params),
        "mismatch": {
            "rollout_kl": mean("rollout_corr/kl"),
            "probs_diff_mean": mean("training/rollout_probs_diff_mean"),
            "ppo_kl": mean("actor/ppo_kl"),
        },
        "entropy": mean("actor/entropy") or mean("actor/entropy_loss"),
    }


def sft_summary(log_text: str, metrics: Path, wall_s: float | None) -> dict[str, Any]:
    """Epoch seconds from the last ``tqdm`` line of the training loop (``steps/total [mm:ss<``)."""
    last = None
    for m in _TQDM.finditer(log_text.replace("\r", "\n")):
        last = m
    out: dict[str, Any] = {"wall_s": wall_s, "epoch_s": None, "steps": None, "steps_per_epoch": None}
    if last:
        done, total = int(last.group(1)), int(last.group(2))
        hours = int(last.group(3)[:-1]) if last.group(3) else 0
        elapsed = hours * 3600 + int(last.group(4)) * 60 + int(last.group(5))
        out.update(steps=done, steps_per_epoch=total, loop_s=elapsed,
                   epoch_s=round(elapsed * total / done, 1) if done else None)  # fmt: skip
    if metrics.is_file():
        rows = [json.loads(line)["data"] for line in metrics.read_text().splitlines() if line.strip()]
        vals = [float(r["val/loss"]) for r in rows if isinstance(r.get("val/loss"), int | float)]
        trains = [float(r["train/loss"]) for r in rows if isinstance(r.get("train/loss"), int | float)]
        out["val_loss"] = round(vals[-1], 4) if vals else None
        out["last_train_loss"] = round(trains[-1], 4) if trains else None
    return out


def parse_smi_time(stamp: str) -> float:
    return dt.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.UTC).timestamp()


def read_gpu_util(path: Path) -> list[tuple[float, int, float]]:
    """``nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits`` lines."""
    out: list[tuple[float, int, float]] = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            out.append((parse_smi_time(parts[0]), int(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def busy_share(
    samples: list[tuple[float, int, float]], gpus: Sequence[int], start: float, end: float | None
) -> float | None:
    """The GPUs' mean utilisation between ``start`` and ``end`` (None: to the last sample)."""
    stop = float("inf") if end is None else end
    vals = [u for t, i, u in samples if i in gpus and start <= t <= stop]
    return round(statistics.fmean(vals) / 100, 3) if vals else None


def _phase_setting(name: str) -> tuple[str, str]:
    phase, _, setting = name.partition("_")
    setting = setting or "run"
    return phase, SETTING_NAMES.get(setting, setting)


def override_of(command: str, key: str) -> int | None:
    """An integer ``key=value`` override of a command line (None where it is not given)."""
    for tok in shlex.split(command):
        if tok.lstrip("+").startswith(f"{key}="):
            return int(tok.split("=", 1)[1])
    return None


def executor_starts(stages_tsv: Path) -> dict[str, float]:
    """Seconds from ``trainer serve start --wait`` to its model listed, per ``exec_<name>`` job: the first run of
    each that exited 0 (a later run of the same name found the executor already up; a failed one never served)."""
    from bench.learning_gpu import read_stages

    if not stages_tsv.is_file():
        return {}
    stages = read_stages(stages_tsv, keep="first", ok_only=True)
    return {name.removeprefix("exec_"): t["seconds"] for name, t in stages.items() if name.startswith("exec_")}


def run_profile(folder: Path) -> dict[str, Any] | None:
    """The py-spy summary of a run (``pyspy.txt.gz`` or ``pyspy.txt`` beside ``pyspy.log``), or None."""
    from bench import pyspy

    raw = next((f for f in (folder / "pyspy.txt.gz", folder / "pyspy.txt") if f.is_file()), None)
    if raw is None:
        return None
    log = (folder / "pyspy.log").read_text(errors="replace") if (folder / "pyspy.log").is_file() else ""
    m = re.search(r"Sampling process (\d+) times a second for (\d+) seconds", log)
    rate, window = (float(m[1]), float(m[2])) if m else (50.0, 30.0)
    return pyspy.summarize(pyspy.read_lines(raw), window, rate)


def job_log_start(log: Path) -> float | None:
    """The epoch seconds of a job log's last ``=== <UTC time> <command>`` line (``job.sh`` writes one a start)."""
    if not log.is_file():
        return None
    stamps = re.findall(r"^=== (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})Z ", log.read_text(errors="replace"), re.M)
    if not stamps:
        return None
    return dt.datetime.strptime(stamps[-1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()


def reward_share(c1: dict[str, Any], b1: dict[str, Any]) -> float | None:
    """C1's generation beyond B1's (the pipeline reward's wait), over C1's step."""
    if not c1.get("step_s"):
        return None
    extra = (c1["split_s"].get("gen") or 0) - (b1["split_s"].get("gen") or 0)
    return round(max(float(extra), 0.0) / float(c1["step_s"]), 3)


def largest_part(row: dict[str, Any]) -> str:
    split = {k: v for k, v in row.get("split_s", {}).items() if v}
    if not split:
        return "-"
    k = max(split, key=lambda key: split[key])
    return f"{k} {split[k]:.2f} s"


def shared_card(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """B1 and B2 at once on the same GPUs (setting ``pair``) against each alone (``fast``): the seconds a step of
    both takes in turn (the sum of the alone steps) and side by side (the slower paired step), and their ratio
    (above 1: sharing the card pays). None when a row is missing."""
    by = {(r["phase"], r["setting"]): r for r in rows if r.get("step_s")}
    need = [("b1", "fast"), ("b2", "fast"), ("b1", "pair"), ("b2", "pair")]
    if not all(k in by for k in need):
        return None
    in_turn = by["b1", "fast"]["step_s"] + by["b2", "fast"]["step_s"]
    side = max(by["b1", "pair"]["step_s"], by["b2", "pair"]["step_s"])
    return {"in_turn_s": round(in_turn, 2), "side_by_side_s": round(side, 2), "gain": round(in_turn / side, 2)}


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each one-GPU goal beside its measured number (None: not run), met or not, and a miss's largest part."""
    fast = {r["phase"]: r for r in out["rows"] if r["setting"] == "fast" and r.get("batch") in (64, None)}
    stock = next((r for r in out["rows"] if r["setting"] == "verl_stock"), None)
    b1, c1 = fast.get("b1"), fast.get("c1")
    sft = [out["sft"][n]["epoch_s"] for n in ("a1_fast", "a2_fast") if n in out["sft"]]
    starts = [r["startup_s"] for r in fast.values() if r.get("startup_s") is not None]
    ready = list(out.get("executor_ready_s", {}).values())
    measured: dict[str, tuple[float | None, str]] = {
        "b1_step_s": (b1["step_s"] if b1 else None, largest_part(b1) if b1 else "-"),
        "c1_step_s": (c1["step_s"] if c1 else None, largest_part(c1) if c1 else "-"),
        "c1_reward_share": (reward_share(c1, b1) if b1 and c1 else None, "the π2 executor's tables"),
        "startup_s": (max(starts) if starts else None, "see the start-up split"),
        "executor_ready_s": (max(ready) if ready else None, "vLLM's start"),
        "sft_two_epochs_side_by_side_s": (round(2 * max(sft), 1) if len(sft) == 2 and all(sft) else None,
                                          "VERL's SFT step"),
        "b1_over_verl_stock": (round(b1["step_s"] / stock["step_s"], 3) if b1 and stock and stock["step_s"] else None,
                               "the step's split beside VERL's"),
    }  # fmt: skip
    rows = []
    for key, goal in TARGETS.items():
        value, part = measured[key]
        met = None if value is None else value <= goal
        rows.append({"target": key, "goal": goal, "measured": value, "met": met, "largest_part": None if met else part})
    return rows


def _paired_steps(
    runs: dict[str, dict[str, Any]], timed: dict[str, dict[str, Any]], steps: dict[str, list[dict[str, Any]]]
) -> dict[str, list[int]]:
    """The ``pair`` runs' overlapping steps (:func:`overlapping_steps`), each run with its start (``runs``), first
    generation (``timed``, :func:`bench.grpo_startup.timed_run`) and logged steps (``steps``)."""
    found: dict[str, tuple[float, Sequence[float]]] = {}
    for name, r in runs.items():
        if _phase_setting(name)[1] != "pair" or name not in timed:
            continue
        first = timed[name]["markers"].get("first_generation")
        if first is not None and steps[name]:
            found[name] = (r["times"]["start"] + first, [float(x["timing_s/step"]) for x in steps[name]])
    return overlapping_steps(found) if len(found) > 1 else {}


def build(
    collected: Sequence[Path], notes: str = "", params: int = SMOLLM2_135M_PARAMS, sft_setting: str = "after"
) -> dict[str, Any]:
    """The report's payload; ``sft_epoch_s`` is read from the SFT runs named ``<phase>_<sft_setting>``."""
    from bench.grpo_startup import timed_run
    from bench.learning_gpu import read_stages

    runs: dict[str, dict[str, Any]] = {}
    executors: dict[str, float] = {}
    card, util, layout = None, [], {}
    versions: dict[str, Any] = {}
    for root in collected:
        if (root / "card.txt").is_file():
            card = (root / "card.txt").read_text().strip()
        if (root / "versions.json").is_file():
            # several archives: a version one of them could not read (null) does not hide another's
            found = json.loads((root / "versions.json").read_text())
            versions |= {k: v for k, v in found.items() if v is not None or k not in versions}
        # the node script writes these beside its run folders, one level down in the archive
        for csv in [root / "gpu_util.csv", *sorted(root.glob("*/gpu_util.csv"))]:
            util += read_gpu_util(csv)
        for runs_json in [root / "runs.json", *sorted(root.glob("*/runs.json"))]:
            if runs_json.is_file():
                layout.update(json.loads(runs_json.read_text()))
        stages = read_stages(root / "jobs" / "stages.tsv") if (root / "jobs" / "stages.tsv").is_file() else {}
        executors |= executor_starts(root / "jobs" / "stages.tsv")
        for log in sorted(root.glob("*/*/train.log")):
            name = log.parent.name
            if name not in stages or not (root / "jobs" / f"{name}.rc").is_file():
                # still running when collected: its logged steps count, its end is unknown; its start is the
                # job log's last "=== <time>" line (a finished earlier try of the same name is not this run)
                start = job_log_start(root / "jobs" / f"{name}.log")
                if step_rows(log.parent / "metrics.jsonl") and name not in runs:
                    runs[name] = {"dir": log.parent, "rc": None,
                                  "times": None if start is None else {"start": start, "end": None, "seconds": None}}
                continue
            runs[name] = {"dir": log.parent, "times": stages[name],
                          "rc": (root / "jobs" / f"{name}.rc").read_text().strip()
                          if (root / "jobs" / f"{name}.rc").is_file() else None}  # fmt: skip
    if not runs:
        raise FileNotFoundError(
            f"--collected: no finished run (jobs/stages.tsv + */NAME/train.log) under {list(collected)}"
        )
    peak = card_peak(card)
    out: dict[str, Any] = {"benchmark": NAME, "card": card, "versions": versions, "params": params,
                           "peak_bf16_flops": peak, "before": {}, "after": {}, "sft": {}, "runs": {}, "rows": [],
                           "executor_ready_s": executors}  # fmt: skip
    grpo = [name for name in runs if not _phase_setting(name)[0].startswith("a")]
    steps_of = {name: step_rows(runs[name]["dir"] / "metrics.jsonl") for name in grpo}
    timed_of = {name: timed_run(name, t["start"], t["end"], runs[name]["rc"], runs[name]["dir"] / "train.log")
                for name in grpo if (t := runs[name]["times"]) is not None}  # fmt: skip
    paired = _paired_steps(runs, timed_of, steps_of)
    for name, r in sorted(runs.items()):
        phase, setting = _phase_setting(name)
        folder: Path = r["dir"]
        command = (folder / "command.sh").read_text() if (folder / "command.sh").is_file() else ""
        gpu_ids = [int(g) for g in str(layout.get(name, {}).get("gpus", "")).split(",") if g.strip()]
        t = r["times"]
        rec: dict[str, Any] = {"phase": phase, "setting": setting, "exit_code": r["rc"], "gpus": gpu_ids,
                               "wall_s": t["seconds"] if t else None, "unfinished": t is None or t["end"] is None,
                               "command": command.strip()}  # fmt: skip
        if phase.startswith("a"):
            if t is None:
                continue
            rec.update(sft_summary((folder / "train.log").read_text(errors="replace"), folder / "metrics.jsonl",
                                   t["seconds"]))  # fmt: skip
            rec["busy_share"] = busy_share(util, gpu_ids, t["start"], t["end"])
            out["sft"][name] = rec
        else:
            n_gpus = gpus_of(command)
            steps = steps_of[name]
            if name in paired:  # side by side: only the steps that ran while the partner stepped too
                rec.update(grpo_summary([steps[i] for i in paired[name]], n_gpus, peak, params, warmup=False))
                rec["steps_logged"] = len(steps)
            else:
                traced = profiled_steps(command)  # steps are numbered from 1 in the order logged
                rec.update(grpo_summary([s for i, s in enumerate(steps, 1) if i not in traced], n_gpus, peak, params))
                rec["steps_traced"] = sorted(traced)
            rec["n_gpus"] = n_gpus
            rec["batch"] = override_of(command, "data.train_batch_size")
            rec["n"] = override_of(command, "actor_rollout_ref.rollout.n")
            rec["startup_s"] = rec["busy_share"] = rec["startup_split"] = None
            rec["profile"] = run_profile(folder)
            rec["trace"] = run_trace(folder)
            if t is not None:
                timed = timed_of[name]
                rec["startup_s"] = timed["seconds_to_first_generation"]
                rec["startup_split"] = [st for st in timed["stages"] if st["to"] != "end"]
                first = timed["markers"].get("first_generation")
                rec["busy_share"] = busy_share(util, gpu_ids, t["start"] + first, t["end"]) if first else None
            if setting in ("before", "after"):
                out[setting][phase] = rec
            row = {k: v for k, v in rec.items() if k not in ("command", "gpus", "profile", "trace")}
            out["rows"].append(row | {"gpus": n_gpus, "name": name})
        out["runs"][name] = {k: v for k, v in rec.items() if k != "command"} | {"command": rec["command"]}
    after = out["after"]
    if "c1" in after and "b1" in after and after["c1"]["step_s"]:
        extra = (after["c1"]["split_s"]["gen"] or 0) - (after["b1"]["split_s"]["gen"] or 0)
        after["c1"]["reward_share"] = round(max(extra, 0.0) / after["c1"]["step_s"], 3)
    before = out["before"]
    if "c1" in before and "b1" in before and before["c1"]["step_s"]:
        extra = (before["c1"]["split_s"]["gen"] or 0) - (before["b1"]["split_s"]["gen"] or 0)
        before["c1"]["reward_share"] = round(max(extra, 0.0) / before["c1"]["step_s"], 3)
    out["floor_s"] = {ph: rec["floor_s"] for ph, rec in after.items()}
    out["sft_setting"] = sft_setting
    out["sft_epoch_s"] = {
        n.split("_")[0]: rec["epoch_s"] for n, rec in out["sft"].items() if n.endswith(f"_{sft_setting}")
    }
    starts = [rec["startup_s"] for rec in after.values() if rec.get("startup_s") is not None]
    out["startup_s"] = max(starts) if starts else None
    out["startup_s_by_phase"] = {ph: rec.get("startup_s") for ph, rec in after.items()}
    b1_fast = next((r for r in out["rows"] if r["phase"] == "b1" and r["setting"] == "fast"), None)
    for r in out["rows"]:
        if r["phase"] == "c1" and b1_fast is not None:
            r["reward_share"] = reward_share(r, b1_fast)
    out["shared_card"] = shared_card(out["rows"])
    out["targets"] = targets(out)
    out["notes"] = notes
    return out


def rows_md(p: dict[str, Any]) -> str:
    """The rows of every setting (ours, VERL's own, other sizes), the targets and the start-up split."""
    rows = [r for r in p.get("rows", []) if r["setting"] not in ("before", "after")]
    if not rows:
        return ""
    md = "## GRPO steps\n\n" + md_table(
        ["phase", "setting", "GPUs", "batch x n", "steps", "step s", "floor s", "x floor", *STAGES, "other",
         "tokens/step", "GPU busy", "s to 1st gen"],
        [[r["phase"], r["setting"], r["gpus"], f"{r.get('batch') or '-'} x {r.get('n') or '-'}",
          f"{r['steps_averaged']}{' (unfinished)' if r.get('unfinished') else ''}", _f(r["step_s"]),
          _f(r["floor_s"], 3),
          _f(round(r["step_s"] / r["floor_s"], 1) if r["step_s"] and r["floor_s"] else None, 1),
          *[_f(r["split_s"].get(k)) for k in (*STAGES, "other")], _f(r["tokens_per_step"], 0), _f(r["busy_share"]),
          _f(r["startup_s"], 0)] for r in rows],
    )  # fmt: skip
    shares = [f"{r['name']} {r['reward_share']:.1%}" for r in rows if r.get("reward_share") is not None]
    if shares:
        md += "\nC1's pipeline reward share (its generation beyond B1's fast row, over its step): "
        md += ", ".join(shares) + ".\n"
    if p.get("shared_card"):
        sc = p["shared_card"]
        md += (f"\nB1 and B2 sharing the card (`pair`, the steps that overlapped): a step of both"
               f" {sc['side_by_side_s']:.2f} s side by side against {sc['in_turn_s']:.2f} s in turn (alone, `fast`):"
               f" {sc['gain']:.2f}x the throughput.\n")
    if p.get("executor_ready_s"):
        md += "\nExecutors ready (`trainer serve start --wait`, command to model listed): " + ", ".join(
            f"{k} {v:.0f} s" for k, v in sorted(p["executor_ready_s"].items())) + ".\n"  # fmt: skip
    if p.get("targets"):
        md += "\n## Targets (one GPU, 64 x 16)\n\n" + md_table(
            ["target", "goal", "measured", "met", "largest part of a miss"],
            [[t["target"], _f(t["goal"]), _f(t["measured"], 3), MET[t["met"]], t["largest_part"] or ""]
             for t in p["targets"]],
        )  # fmt: skip
    split_rows = [[r["name"], st["stage"], _f(st["seconds"], 1)] for r in rows for st in (r.get("startup_split") or [])]
    if split_rows:
        md += "\n## Start-up: command to first generation, by stage\n\n" + md_table(["run", "stage", "s"], split_rows)
    return md + "\n"


def _f(x: Any, nd: int = 2) -> str:
    return "–" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def render_md(p: dict[str, Any], command: str) -> str:
    v = p["versions"]
    md = ("# RL at the speed of the hardware: a GRPO step, an SFT epoch and a start-up\n\n"
          f"- card: {'; '.join((p['card'] or 'unknown').splitlines())}\n"
          f"- versions: {', '.join(f'{k} {x}' for k, x in v.items()) or 'unknown'}\n"
          f"- policy: {p['params'] / 1e6:.1f}M parameters; floor = 8 N T / (bf16 peak "
          f"{(p['peak_bf16_flops'] or 0) / 1e12:.1f} TFLOP/s x GPUs), T the step's prompt + response tokens\n"
          "- on the node: `scripts/gpu_node/rl_step.sh` (jobs of `scripts/gpu_node/job.sh`); this report: "
          f"`{command}`\n\n")  # fmt: skip
    md += rows_md(p)
    rows = []
    for phase in sorted(set(p["before"]) | set(p["after"])):
        for setting in ("before", "after"):
            r = p[setting].get(phase)
            if not r:
                continue
            s = r["split_s"]
            steps = f"{r['steps_averaged']}{' (unfinished)' if r.get('unfinished') else ''}"
            rows.append([phase, setting, r["n_gpus"], steps, _f(r["step_s"]), _f(r["floor_s"], 3),
                         *[_f(s.get(k)) for k in (*STAGES, "other")], _f(r["tokens_per_s"], 0), _f(r["busy_share"]),
                         _f(r["startup_s"], 0)])  # fmt: skip
    if rows:
        md += "## GRPO steps, before and after (64 prompts x 16 samples)\n\n" + md_table(
        ["phase", "setting", "GPUs", "steps", "step s", "floor s", *STAGES, "other", "tokens/s", "GPU busy",
         "s to 1st gen"], rows)  # fmt: skip
        md += "\n"
    c1 = p["after"].get("c1", {})
    if "reward_share" in c1:
        md += (f"\nC1's reward share (its generation beyond B1's, over its step): after {c1['reward_share']:.1%}"
               + (f", before {p['before']['c1']['reward_share']:.1%}" if "reward_share" in p["before"].get("c1", {})
                  else "") + ".\n")  # fmt: skip
    mism = [
        [ph, _f(m["rollout_kl"], 6), _f(m["probs_diff_mean"], 5), _f(m["ppo_kl"], 6)]
        for ph, r in sorted(p["before"].items())
        if (m := r["mismatch"])["rollout_kl"]
    ]
    if mism:
        md += "\n## Rollout vs actor log-probs (where the actor recomputed them)\n\n" + md_table(
            ["phase", "KL(rollout, actor) per token", "mean abs(p diff)", "PPO KL in one update"], mism
        )
    if p["sft"]:
        md += "\n## SFT (an epoch of the golden train split, extrapolated from the steps run)\n\n" + md_table(
            ["run", "GPUs", "steps run", "steps/epoch", "epoch s", "job wall s", "val loss", "GPU busy"],
            [[n, ",".join(map(str, r["gpus"])), r["steps"], r["steps_per_epoch"], _f(r["epoch_s"], 0),
              _f(r["wall_s"], 0), _f(r.get("val_loss"), 4), _f(r["busy_share"])] for n, r in sorted(p["sft"].items())],
        )  # fmt: skip
    profiled = [(n, r["profile"]) for n, r in sorted(p["runs"].items()) if r.get("profile")]
    if profiled:
        from bench import pyspy

        md += "\n## Where a step's CPU time goes\n\n" + "\n".join(pyspy.markdown(prof, n) for n, prof in profiled)
    traced = [(n, r["trace"]) for n, r in sorted(p["runs"].items()) if r.get("trace")]
    if traced:
        from bench import torch_trace

        md += "\n## A traced step's worker stages (PyTorch's profiler in the worker; the step is out of the means)\n\n"
        md += "\n".join(torch_trace.markdown(t, f"{n}, {t.get('trace', 'trace')}") for n, t in traced)
    md += "\n## Commands\n\n" + "\n".join(
        f"- `{n}`: `{r['command']}`" for n, r in sorted(p["runs"].items()) if r["command"]
    )
    return md + "\n" + (("\n" + p["notes"].strip() + "\n") if p.get("notes") else "")


def plot(p: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, splits, floors = [], [], []
    for r in p.get("rows", []):
        if r["setting"] not in ("before", "after") and r["step_s"]:
            labels.append(f"{r['phase']} {r['setting']} {r.get('batch') or ''}x{r.get('n') or ''}")
            splits.append(r["split_s"])
            floors.append(r["floor_s"])
    for phase in sorted(set(p["before"]) | set(p["after"])):
        for setting in ("before", "after"):
            r = p[setting].get(phase)
            if r and r["step_s"]:
                labels.append(f"{phase} {setting}")
                splits.append(r["split_s"])
                floors.append(r["floor_s"])
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(labels) + 1.5))
    left = [0.0] * len(labels)
    for stage in (*STAGES, "other"):
        widths = [max(s.get(stage) or 0.0, 0.0) for s in splits]
        ax.barh(labels, widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, f in enumerate(floors):
        if f:
            ax.plot([f, f], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per GRPO step (black bar: the floor at the card's bf16 peak)")
    ax.legend(ncol=4, fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(
    collected: Sequence[Path], notes_file: Path | None = None, name: str = NAME, sft_setting: str = "after"
) -> dict[str, Any]:
    payload = build(collected, notes_file.read_text() if notes_file else "", sft_setting=sft_setting)
    command = "python -m bench rl-step " + " ".join(f"--collected {c}" for c in collected)
    command += f" --sft-setting {sft_setting}" if sft_setting != "after" else ""
    command += f" --name {name}" if name != NAME else ""
    command += f" --notes {notes_file}" if notes_file else ""
    payload["command"] = command
    write_result(name, payload, render_md(payload, command), quick=False)
    plot(payload, RESULTS_DIR / f"{name}.png")
    return payload

"""The CPU smoke loop: every phase at toy scale, then checks of what the loop left behind.

``python -m trainer.smoke.loop --out DIR [--golden trainer/data/sample] [overrides]`` runs
``trainer loop --profile cpu-smoke --rft`` in this process (A1, A2 → RFT baseline → B1, B2 → C1 →
precompute → C2 → Phase D, from the base SmolLM2-135M-Instruct), sampling the peak RSS of the whole process tree and
every listening socket, and then checks: a checkpoint and an exported HF directory per phase, that
the executor served the exported models (Phase D's predictions name them and hold their output), the
Phase-D report comparing sft, local, pipe and rft, and the run record. Resumable like the loop. Writes
``smoke_loop_result.json``; the last line is ``N passed, N failed``. Wrapped by
``scripts/smoke_loop.sh`` (a loopback-only network namespace).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import typer

from trainer.registry.phases import PHASES
from trainer.serving.shutdown import exit_on_sigterm
from trainer.smoke.grpo import SAMPLE_DIR, SMOKE_FAILURE_MODE, Checks, MemorySampler, finish

PHASE_DIRS = tuple(PHASES)
RFT_DIRS = ("rft/schema/sft", "rft/table/sft")
SETTINGS = ("sft", "local", "pipe")
# Max new tokens of the smoke loop's own generation and of C1's reward executor: the CPU smoke's override of
# LoopConfig's eval_max_tokens and reward_max_tokens (shared.EVAL_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS),
# so that the toy models' long answers keep the smoke's time bounded on 2 cores.
LOOP_SMOKE_MAX_TOKENS = 256


def check_outputs(out: Path, checks: Checks, rft: bool = True) -> dict[str, Any]:
    """Checks of a finished loop folder; returns the Phase-D metrics (empty if missing)."""
    manifest = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    hf_dirs: dict[str, str] = {}
    for name in PHASE_DIRS + (RFT_DIRS if rft else ()):
        rec = manifest.get("phases", {}).get(name, {})
        ckpts = sorted((out / name / "checkpoints").glob("global_step_*"))
        hf = rec.get("hf_dir")
        ok = rec.get("status") == "ok" and bool(ckpts) and bool(hf) and (Path(hf) / "config.json").is_file()
        if hf:
            hf_dirs[name] = hf
        checks.add(f"{name}: checkpoint and exported HF directory", ok, f"{[c.name for c in ckpts]} → {hf}")
    metrics_path = out / "eval_loop1" / "metrics.json"
    metrics: dict[str, Any] = json.loads(metrics_path.read_text())["settings"] if metrics_path.is_file() else {}
    settings = SETTINGS + (("rft",) if rft else ())
    checks.add(
        f"Phase-D report compares {', '.join(settings)}",
        set(settings) <= set(metrics) and (out / "eval_loop1" / "report.md").is_file(),
        f"settings {sorted(metrics)}",
    )
    want = {"sft": ("a1", "a2"), "local": ("b1", "b2"), "pipe": ("c1", "c2")}
    if rft:
        want["rft"] = RFT_DIRS
    for setting, (p1, p2) in want.items():
        path = out / "eval_loop1" / f"predictions_{setting}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        served = (
            bool(rows)
            and p1 in hf_dirs
            and p2 in hf_dirs
            and all(r["schema_model"] == hf_dirs[p1] and r["table_model"] == hf_dirs[p2] for r in rows)
        )
        generated = sum(bool(r.get("schema_prediction")) for r in rows)
        checks.add(
            f"executor served the {p1}/{p2} exports in Phase D ({setting})",
            served and generated == len(rows),
            f"{len(rows)} predictions, {generated} non-empty schema outputs",
        )
    pre: dict[str, Any] = manifest.get("precompute:loop1") or {}
    pre_ok = "c1" in hf_dirs and pre.get("schema_model") == hf_dirs["c1"]
    checks.add("C2 schemas precomputed by π1ʳ-pipe (the C1 export)", pre_ok, str(pre))
    return metrics


def main(
    out: Path = typer.Option(Path("runs/smoke_loop"), help="Loop folder (resumable)."),
    golden: Path = typer.Option(SAMPLE_DIR, exists=True, file_okay=False, help="Golden folder."),
    eval_limit: int = typer.Option(3, min=1, help="Test examples in Phase D."),
    rft: bool = typer.Option(True, help="Also train and evaluate the RFT baseline."),
    overrides: list[str] = typer.Argument(None, help="Hydra overrides for the RL phases."),
) -> None:
    from services.executor_vllm.default_model import convert
    from trainer.runs.config import LoopConfig
    from trainer.runs.loop import Loop

    checks = Checks()
    t0 = time.monotonic()
    cfg = LoopConfig(
        golden=golden,
        out=out,
        profile="cpu-smoke",
        pi1_sft=None,
        pi2_sft=None,
        base_model=str(convert()),
        eval_limit=eval_limit,
        eval_max_truncated_share=1.0,  # a few SFT steps on CPU write past max tokens: counted, not failed on
        eval_max_tokens=LOOP_SMOKE_MAX_TOKENS,
        reward_max_tokens=LOOP_SMOKE_MAX_TOKENS,
        rl_extra=(SMOKE_FAILURE_MODE, *(overrides or ())),  # opt-in penalize, named: trainer/smoke/grpo.py says why
        rft=rft,
    )
    error = None
    with MemorySampler(os.getpid()) as mem:
        try:
            Loop(cfg).run()
        except Exception as exc:  # the checks below say what is missing; the error is kept
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
    checks.add("trainer loop --profile cpu-smoke finished", error is None, error or "")
    metrics = check_outputs(out, checks, rft)
    summary = {"total_s": round(time.monotonic() - t0, 1), "phase_d": {s: m.get("overall") for s, m in metrics.items()}}
    report = f"report: {out / 'eval_loop1' / 'report.md'}"
    raise typer.Exit(finish(out, checks, summary, mem, "smoke_loop_result.json", (report,)))

if __name__ == "__main__":
    exit_on_sigterm()
    typer.run(main)

"""``python -m trainer loop``: the loop's command, beside the loop (``trainer/loop.py``).

Mounted on the main app by :func:`register` (``trainer/cli.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from trainer.loop import PARTS, Loop, LoopConfig
from trainer.phases.cli import ProfileOpt, bad_param, default_model
from trainer.phases.launch import check_profile
from trainer.serving.gpus import GpuPlanError, visible_gpus

console = Console()
app = typer.Typer(help="The RL loop.", no_args_is_help=True)


@app.command("loop", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def loop_cmd(
    ctx: typer.Context,
    golden: Path = typer.Option(
        ..., exists=True, file_okay=False, help="Golden folder (common_{split}_schemas.jsonl)."
    ),
    out: Path = typer.Option(Path("runs/loop"), help="Loop folder (resumable)."),
    profile: str = ProfileOpt,
    pi1_sft: str | None = typer.Option(None, help="π1ˢ (an A1 output). Default: run A1 from --base-model."),
    pi2_sft: str | None = typer.Option(None, help="π2ˢ (an A2 output). Default: run A2 from --base-model."),
    base_model: str | None = typer.Option(
        None, help="Start model of A1/A2 when no SFT checkpoint is given. cpu-smoke default: SmolLM2-135M-Instruct."
    ),
    sft_override: list[str] = typer.Option(
        [], "--sft-override", help="Hydra override for A1/A2 (repeatable); the trailing overrides go to RL phases."
    ),
    reward_url: str | None = typer.Option(None, help="Reward API for B1/B2/C2 (default: start one locally)."),
    c1_reward_url: str | None = typer.Option(None, help="Reward API whose executor serves π2ʳ-local (cluster)."),
    pi1_pipe_url: str | None = typer.Option(None, help="Executor serving π1ʳ-pipe for C2 precompute (cluster)."),
    limit: int | None = typer.Option(None, min=1, help="First N examples per split (data)."),
    eval_limit: int | None = typer.Option(None, min=1, help="First N test examples in Phase D."),
    loops: int = typer.Option(1, min=1, max=2, help="2: run C1→C2 again if loop 1 gained ≥ --min-gain."),
    min_gain: float = typer.Option(1.0, help="Loop-2 rule: stop when the end-to-end gain is below this (points)."),
    rft: bool = typer.Option(False, help="Also train the RFT baseline from π1ˢ/π2ˢ and add it to Phase D."),
    rft_k: int = typer.Option(4, min=1, help="RFT: samples per prompt."),
    rft_threshold: float = typer.Option(0.5, min=-1.0, max=1.0, help="RFT: keep the best sample if reward ≥ this."),
    gpus: str | None = typer.Option(
        None, help="gpu profile: GPU ids to use (default: CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists)."
    ),
    until: str | None = typer.Option(
        None, help=f"Stop after this part of the loop ({', '.join(PARTS)}); a rerun goes on from there."
    ),
    reward_workers: int = typer.Option(1, min=1, help="uvicorn workers of the reward_api the loop starts."),
    preflight_min: float | None = typer.Option(
        None, min=0.0, max=1.0,
        help="Before each GRPO phase: stop unless this share of groups has rewards that differ and at least 10% of "
        "prompts (macro over sources) have a sample that beats the greedy answer (no headroom otherwise).",
    ),
    c2_train_prompts: int | None = typer.Option(
        None,
        min=1,
        help="C2 precompute: a seeded random N train documents (default: all; VERL uses train_max_samples).",
    ),
    executor_cuda_graphs: bool = typer.Option(
        False, help="GPU executors with CUDA graphs + torch.compile (slower start; for larger models). Default: eager."
    ),
) -> None:
    """(A1, A2 →) B1 → B2 → C1 → C2 → Phase-D evaluation; Hydra overrides after the options apply to every RL phase."""
    try:
        prof = check_profile(profile)
    except ValueError as exc:
        raise bad_param("--profile", exc) from None
    if until is not None and until not in PARTS:
        raise bad_param("--until", ValueError(f"must be one of {list(PARTS)}, got {until!r}"))
    try:
        gpu_ids = visible_gpus(gpus) if prof == "gpu" else ()
    except GpuPlanError as exc:
        raise bad_param("--gpus", exc) from None
    base = base_model or (None if (pi1_sft and pi2_sft) else default_model(prof, "--base-model"))
    cfg = LoopConfig(
        golden=golden,
        out=out,
        profile=prof,
        pi1_sft=pi1_sft,
        pi2_sft=pi2_sft,
        base_model=base,
        sft_overrides=tuple(sft_override),
        reward_url=reward_url,
        c1_reward_url=c1_reward_url,
        pi1_pipe_url=pi1_pipe_url,
        limit=limit,
        eval_limit=eval_limit,
        loops=loops,
        min_gain=min_gain,
        overrides=tuple(ctx.args),
        rft=rft,
        rft_k=rft_k,
        rft_threshold=rft_threshold,
        gpus=gpu_ids,
        until=until,
        reward_workers=reward_workers,
        preflight_min=preflight_min,
        c2_train_prompts=c2_train_prompts,
        executor_eager=not executor_cuda_graphs,
    )
    manifest = Loop(cfg).run()
    if manifest.get("stopped_after"):
        console.print(f"stopped after {manifest['stopped_after']!r} (--until); rerun to go on")
    console.print(f"manifest: {out / 'loop_manifest.json'}")
    console.print_json(json.dumps(manifest.get("final_decision", {})))


def register(main_app: typer.Typer) -> None:
    """Add ``loop`` to the main ``python -m trainer`` app."""
    main_app.registered_commands.extend(app.registered_commands)

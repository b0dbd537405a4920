"""``python -m trainer run|loop|preflight*|positive-control|rft|export``: phase launchers, the loop, the checks
before RL, the RFT baseline.

Mounted on the main app by :func:`register` (``trainer/cli.py``: ``from trainer.phases.cli import
register`` + ``register(app)``), or run alone as ``python -m trainer.phases.cli``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from trainer.phases.launch import PHASES, PROFILES, PhaseRun, check_profile, get_phase, run_phase

console = Console()
app = typer.Typer(help="Training phases, the RL loop and the RFT baseline.", no_args_is_help=True)

ProfileOpt = typer.Option("gpu", "--profile", help=f"One of {list(PROFILES)} (cpu-smoke loads the CPU shim).")


def _default_model(profile: str, param: str = "--model") -> str:
    if profile != "cpu-smoke":
        raise typer.BadParameter("required with --profile gpu", param_hint=param)
    from services.executor_vllm.default_model import convert

    return str(convert())


def _bad(param: str, exc: Exception) -> typer.BadParameter:
    return typer.BadParameter(str(exc), param_hint=param)


@app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run one phase (a1 a2 b1 b2 c1 c2) with Hydra overrides after the options.",
)
def run_cmd(
    ctx: typer.Context,
    phase: str = typer.Argument(..., help=f"Phase: {', '.join(PHASES)}."),
    profile: str = ProfileOpt,
    data: Path = typer.Option(Path("data"), help="Folder of `trainer data build` (<phase>/<split>.parquet)."),
    out: Path | None = typer.Option(None, help="Output folder (default runs/<phase>)."),
    model: str | None = typer.Option(None, help="Start model (HF dir). cpu-smoke default: SmolLM2-135M-Instruct."),
    reward_url: str | None = typer.Option(None, help="Reward API URL (default: $REWARD_API_URL)."),
    nproc: int = typer.Option(1, min=1, help="SFT: torchrun processes (GPUs) per node."),
    export: bool = typer.Option(True, help="Export the best checkpoint to <out>/hf."),
    dry_run: bool = typer.Option(False, help="Print the command and exit."),
) -> None:
    try:
        ph = get_phase(phase)
    except ValueError as exc:
        raise _bad("PHASE", exc) from None
    try:
        prof = check_profile(profile)
    except ValueError as exc:
        raise _bad("--profile", exc) from None
    run = PhaseRun(
        phase=ph,
        profile=prof,
        data_dir=data,
        out_dir=out or Path("runs") / ph.name,
        model_path=model or _default_model(prof),
        reward_url=reward_url,
        overrides=tuple(ctx.args),
        nproc=nproc,
    )
    try:
        run.env()
    except ValueError as exc:
        raise _bad("--reward-url", exc) from None
    console.print(" ".join(run.command()))
    if dry_run:
        return
    res = run_phase(run, export=export)
    console.print_json(json.dumps(res.__dict__, default=str))
    if res.monitors:
        console.print(f"{ph.name}: {res.monitors['verdict']}")
    if res.status != "ok":
        raise typer.Exit(res.exit_code or 1)


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
        None, help="Stop after this stage group (sft, local, c1, c2, eval); a rerun goes on from there."
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
    from trainer.loop import STAGE_GROUPS, Loop, LoopConfig
    from trainer.serving.gpus import GpuPlanError, visible_gpus

    try:
        prof = check_profile(profile)
    except ValueError as exc:
        raise _bad("--profile", exc) from None
    if until is not None and until not in STAGE_GROUPS:
        raise _bad("--until", ValueError(f"must be one of {list(STAGE_GROUPS)}, got {until!r}"))
    try:
        gpu_ids = visible_gpus(gpus) if prof == "gpu" else ()
    except GpuPlanError as exc:
        raise _bad("--gpus", exc) from None
    base = base_model or (None if (pi1_sft and pi2_sft) else _default_model(prof, "--base-model"))
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


@app.command("preflight")
def preflight_cmd(
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Golden folder (training prompts)."),
    phase: str = typer.Option(..., help="GRPO phase whose reward is checked: b1, b2, c1 or c2."),
    policy_url: str = typer.Option(..., help="Executor serving the phase's start policy."),
    policy_model: str = typer.Option(..., help="Served model name of the policy."),
    reward_url: str = typer.Option(..., help="Reward API the phase will use (C1: its executor serves π2)."),
    n: int = typer.Option(8, min=2, help="Samples per prompt (the phase's rollout.n)."),
    prompts: int = typer.Option(32, min=1, help="Training prompts to sample per source."),
    sources: str | None = typer.Option(None, help="Comma-separated sources to check (default: every source)."),
    temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature (the phase's rollout temperature)."),
    max_tokens: int = typer.Option(512, min=1, help="max_tokens per sample (the phase's response length)."),
    min_informative: float = typer.Option(0.25, min=0.0, max=1.0, help="Fail below this share of informative groups."),
    min_improvable: float = typer.Option(
        0.10, min=0.0, max=1.0, help="No headroom (fail) below this macro share of prompts whose best beats greedy."
    ),
    out: Path | None = typer.Option(None, help="Write the report JSON here."),
) -> None:
    """Before a long GRPO run: per source, the informative and improvable shares, best-of-n − greedy, invalid share."""
    from trainer.phases.preflight import PHASE_STAGE, advantage_check, write_report

    sources = sources or ""
    if phase not in PHASE_STAGE:
        raise _bad("--phase", ValueError(f"must be one of {list(PHASE_STAGE)}, got {phase!r}"))
    rep = advantage_check(
        golden, PHASE_STAGE[phase], policy_url, policy_model, reward_url,
        n=n, prompts=prompts, temperature=temperature, max_tokens=max_tokens, min_informative=min_informative,
        min_improvable=min_improvable, sources=[x.strip() for x in sources.split(",") if x.strip()] or None,
    )  # fmt: skip
    if out:
        write_report(rep, out)
    console.print_json(json.dumps({k: v for k, v in rep.as_dict().items() if k != "improvable_ids"}))
    typer.echo(f"{phase}: {rep.verdict()}", err=True)
    if not rep.ok:
        raise typer.Exit(1)


@app.command("preflight-choose")
def preflight_choose_cmd(
    folder: Path = typer.Option(..., "--dir", exists=True, file_okay=False, help="Folder of <phase>_t<T>.json."),
    phases: str = typer.Option("b1,c1", help="Comma-separated phases that must all have enough signal."),
    criterion: str = typer.Option(
        "improvable", help="improvable (best sample beats greedy, macro over sources) or informative (issue 12)."
    ),
    min_share: float = typer.Option(0.10, min=0.0, max=1.0, help="Share of the criterion wanted in every phase."),
    out: Path | None = typer.Option(None, help="Write the choice (and the sweep it came from) here as JSON."),
) -> None:
    """Choose the rollout temperature from a preflight sweep: prints only the temperature (for shells)."""
    from trainer.phases.preflight import choose_temperature, read_sweep, write_report

    if criterion not in ("improvable", "informative"):
        raise _bad("--criterion", ValueError(f"must be improvable or informative, got {criterion!r}"))
    names = [p.strip() for p in phases.split(",") if p.strip()]
    try:
        choice = choose_temperature(read_sweep(folder, names), min_share, criterion)  # type: ignore[arg-type]
    except ValueError as exc:
        raise _bad("--dir", exc) from None
    if out:
        write_report(choice, out)
    typer.echo(f"{choice.reason}: {choice.temperature}", err=True)
    for ph in choice.no_headroom:
        typer.echo(f"NO HEADROOM: {ph} at temperature {choice.temperature} (< {min_share:.0%} {criterion})", err=True)
    typer.echo(f"{choice.temperature}")


@app.command("preflight-filter")
def preflight_filter_cmd(
    report: Path = typer.Option(..., exists=True, dir_okay=False, help="A preflight report (--out of preflight)."),
    train: Path = typer.Option(..., exists=True, dir_okay=False, help="The phase's RL train.parquet (data build)."),
    out: Path = typer.Option(..., help="Parquet of the improvable prompts (point data.train_files at it)."),
) -> None:
    """Offline difficulty filter: keep the training prompts whose best sample beat the greedy answer."""
    from trainer.phases.preflight import improvable_prompt_set

    rep = json.loads(report.read_text())
    if "improvable_ids" not in rep:
        raise _bad("--report", ValueError(f"{report}: no improvable_ids (a report of before issue 23: rerun it)"))
    try:
        kept, missing = improvable_prompt_set(train, rep["improvable_ids"], out)
    except ValueError as exc:
        raise _bad("--train", exc) from None
    typer.echo(f"{kept} improvable prompts -> {out}" + (f" ({len(missing)} ids not in {train})" if missing else ""))


@app.command(
    "positive-control",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="A few GRPO steps trained and validated on the same improvable prompts must raise their greedy reward.",
)
def positive_control_cmd(
    ctx: typer.Context,
    phase: str = typer.Argument(..., help="GRPO phase whose recipe is checked: b1, b2, c1 or c2."),
    prompts: Path = typer.Option(
        ..., exists=True, dir_okay=False, help="Improvable prompt set (trainer preflight-filter)."
    ),
    profile: str = ProfileOpt,
    out: Path | None = typer.Option(None, help="Output folder (default runs/<phase>_control)."),
    model: str | None = typer.Option(None, help="Start policy (HF dir). cpu-smoke default: SmolLM2-135M-Instruct."),
    reward_url: str | None = typer.Option(None, help="Reward API URL (default: $REWARD_API_URL)."),
    size: int = typer.Option(16, min=4, help="Prompts trained and validated on (a multiple of 4)."),
    steps: int = typer.Option(8, min=1, help="GRPO steps."),
    margin: float = typer.Option(0.05, help="Required rise of the greedy reward (macro over data sources)."),
    dry_run: bool = typer.Option(False, help="Print the command and exit."),
) -> None:
    from trainer.phases.positive_control import ControlConfig, control_run, run_control

    try:
        ph = get_phase(phase)
        if ph.kind != "grpo":
            raise ValueError(f"must be a GRPO phase (b1, b2, c1, c2), got {phase!r}")
    except ValueError as exc:
        raise _bad("PHASE", exc) from None
    try:
        cfg = ControlConfig(size=size, steps=steps, margin=margin)
        prof = check_profile(profile)
    except ValueError as exc:
        raise _bad("--size/--steps/--margin/--profile", exc) from None
    run = control_run(
        ph, prof, prompts, out or Path("runs") / f"{ph.name}_control", model or _default_model(prof), reward_url,
        cfg, tuple(ctx.args),
    )  # fmt: skip
    try:
        run.env()
    except ValueError as exc:
        raise _bad("--reward-url", exc) from None
    console.print(" ".join(run.command()))
    if dry_run:
        return
    res, verdict = run_control(run, prompts, cfg)
    console.print(verdict.reason)
    if res.monitors:
        console.print(f"{ph.name} control: {res.monitors['verdict']}")
    if not verdict.passed:
        raise typer.Exit(1)


@app.command("rft", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def rft_cmd(
    ctx: typer.Context,
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Golden folder."),
    stage: str = typer.Option("schema", help="schema | pipeline (π1, trains as A1) or table (π2, trains as A2)."),
    policy_url: str = typer.Option(..., help="Executor serving the policy to sample from."),
    policy_model: str = typer.Option(..., help="Served model name of the policy."),
    start_model: str | None = typer.Option(
        None, help="HF dir fine-tuned on the kept samples (default: skip training)."
    ),
    reward_url: str = typer.Option(..., help="Reward API URL."),
    out: Path = typer.Option(Path("runs/rft"), help="Output folder."),
    k: int = typer.Option(4, min=1, help="Samples per prompt."),
    threshold: float = typer.Option(0.5, help="Keep the best sample only if its reward ≥ this."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    max_tokens: int = typer.Option(256, help="max_tokens per sample."),
    limit: int | None = typer.Option(None, min=1, help="First N training examples."),
    profile: str = ProfileOpt,
) -> None:
    """Sample k, score via reward_api, keep the best ≥ threshold, write SFT parquet, train with the SFT launcher."""
    from trainer.rft import SFT_PHASE, RftConfig, build_rft_data

    if stage not in SFT_PHASE:
        raise typer.BadParameter(f"must be one of {list(SFT_PHASE)}, got {stage!r}", param_hint="--stage")
    try:
        cfg = RftConfig(k=k, threshold=threshold, temperature=temperature, max_tokens=max_tokens)
        prof = check_profile(profile)
    except ValueError as exc:
        raise _bad("--k/--threshold/--profile", exc) from None
    report = build_rft_data(golden, out, stage, policy_url, policy_model, reward_url, cfg, limit)  # type: ignore[arg-type]
    table = Table("stage", "prompts", "samples", "kept", "mean best reward")
    table.add_row(
        report.stage, str(report.prompts), str(report.samples), str(report.kept), f"{report.mean_best_reward:.3f}"
    )
    console.print(table)
    if start_model:
        run = PhaseRun(
            phase=get_phase(SFT_PHASE[stage]),
            profile=prof,
            data_dir=out / "data",
            out_dir=out / "sft",
            model_path=start_model,
            overrides=tuple(ctx.args),
        )
        res = run_phase(run)
        console.print(
            f"RFT model: {res.hf_dir} (status {res.status}); compare: trainer evaluate pipeline --setting rft=..."
        )
        if res.status != "ok":
            raise typer.Exit(res.exit_code or 1)


@app.command("export")
def export_cmd(
    step_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="<ckpt>/global_step_N"),
    target: Path = typer.Option(..., help="HF output directory (replaced)."),
    kind: str = typer.Option("grpo", help="grpo (shards in actor/) or sft."),
) -> None:
    """Merge an FSDP checkpoint into a Hugging Face directory vLLM can serve."""
    from trainer.phases.export import export_checkpoint

    if kind not in ("grpo", "sft"):
        raise typer.BadParameter("must be grpo or sft", param_hint="--kind")
    console.print(str(export_checkpoint(step_dir, target, kind="grpo" if kind == "grpo" else "sft")))


def register(main_app: typer.Typer) -> None:
    """Add ``run``, ``loop``, ``rft`` and ``export`` to the main ``python -m trainer`` app."""
    main_app.registered_commands.extend(app.registered_commands)


if __name__ == "__main__":
    app()

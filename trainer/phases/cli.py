"""``python -m trainer run|preflight*|positive-control|export``: the phase launcher, the checks before RL and
checkpoint export. (``loop`` and ``experiment`` are ``trainer/run_cli.py``'s, ``rft`` ``trainer/cli.py``'s: they sit
above the phases.)

Mounted on the main app by :func:`register` (``trainer/cli.py``: ``from trainer.phases.cli import
register`` + ``register(app)``), or run alone as ``python -m trainer.phases.cli``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console

from trainer.checks.preflight import PreflightSize
from trainer.config_cli import field_option
from trainer.evaluation.generation import GenerationSettings
from trainer.phases.launch import PROFILES, PhaseRun, check_profile, run_phase
from trainer.phases.token_overrides import TokenInOverrideError, check_no_token
from trainer.registry.phases import GRPO_PHASES, PHASES, get_phase, reward_of
from trainer.serving.reward_api_env import CLIENT_URL_ENV

console = Console()
app = typer.Typer(help="Training phases and the checks before RL.", no_args_is_help=True)

# What a container (the compose `trainer` service, the Kubernetes trainer Job) sets instead of ``run``'s options:
# the data folder, the start model and the folder of the phases' output folders (<it>/<phase>). The launcher
# hands VERL's processes the phase's resolved data folder under the same first name.
DATA_DIR_ENV = "TRAINER_DATA_DIR"
MODEL_PATH_ENV = "TRAINER_ACTOR_MODEL_PATH"
OUTPUT_DIR_ENV = "TRAINER_OUTPUT_DIR"
RUN_ENV = (DATA_DIR_ENV, MODEL_PATH_ENV, OUTPUT_DIR_ENV)

ProfileOpt = typer.Option("gpu", "--profile", help=f"One of {list(PROFILES)} (cpu-smoke loads the CPU shim).")


def default_model(profile: str, param: str = "--model") -> str:
    if profile != "cpu-smoke":
        raise typer.BadParameter("required with --profile gpu", param_hint=param)
    from services.executor_vllm.default_model import convert

    return str(convert())


def bad_param(param: str, exc: Exception) -> typer.BadParameter:
    return typer.BadParameter(str(exc), param_hint=param)


def no_token(overrides: Sequence[str], where: str) -> tuple[str, ...]:
    """The trailing Hydra overrides, or one line on stderr and exit 2 where one sets a reward API token (before
    anything is written)."""
    try:
        check_no_token(overrides, where)
    except TokenInOverrideError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return tuple(overrides)


@app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run one phase (a1 a2 b1 b2 c1 c2) with Hydra overrides after the options.",
)
def run_cmd(
    ctx: typer.Context,
    phase: str = typer.Argument(..., help=f"Phase: {', '.join(PHASES)}."),
    profile: str = ProfileOpt,
    data: Path = typer.Option(
        Path("data"), envvar=DATA_DIR_ENV, help="Folder of `trainer data build` (<phase>/<split>.parquet)."
    ),
    out: Path | None = typer.Option(
        None, help=f"Output folder (default ${OUTPUT_DIR_ENV}/<phase> when that is set, else runs/<phase>)."
    ),
    model: str | None = typer.Option(
        None, envvar=MODEL_PATH_ENV, help="Start model (HF dir). cpu-smoke default: SmolLM2-135M-Instruct."
    ),
    reward_url: str | None = typer.Option(None, help=f"Reward API URL (default: ${CLIENT_URL_ENV})."),
    nproc: int = typer.Option(1, min=1, help="SFT: torchrun processes (GPUs) per node."),
    export: bool = typer.Option(True, help="Export the best checkpoint to <out>/hf."),
    dry_run: bool = typer.Option(False, help="Print the command and exit."),
) -> None:
    try:
        ph = get_phase(phase)
    except ValueError as exc:
        raise bad_param("PHASE", exc) from None
    try:
        prof = check_profile(profile)
    except ValueError as exc:
        raise bad_param("--profile", exc) from None
    overrides = no_token(ctx.args, f"trainer run {ph.name}")
    run = PhaseRun(
        phase=ph,
        profile=prof,
        data_dir=data,
        out_dir=out or Path(os.environ.get(OUTPUT_DIR_ENV) or "runs") / ph.name,
        model_path=model or default_model(prof),
        reward_url=reward_url,
        overrides=overrides,
        nproc=nproc,
    )
    try:
        run.env()
    except ValueError as exc:
        raise bad_param("--reward-url", exc) from None
    console.print(f"{ph.name}: data {run.data_dir}, model {run.model_path}, out {run.out_dir}", markup=False)
    console.print(" ".join(run.command()), markup=False)  # Hydra lists ([model,extra]) are not markup
    if dry_run:
        return
    res = run_phase(run, export=export)
    console.print_json(json.dumps(res.__dict__, default=str))
    if res.monitors:
        console.print(f"{ph.name}: {res.monitors['verdict']}")
    if res.status != "ok":
        raise typer.Exit(res.exit_code or 1)


@app.command("preflight")
def preflight_cmd(
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Golden folder (training prompts)."),
    phase: str = typer.Option(..., help="GRPO phase whose reward is checked: b1, b2, c1 or c2."),
    policy_url: str = typer.Option(..., help="Executor serving the phase's start policy."),
    policy_model: str = typer.Option(..., help="Served model name of the policy."),
    reward_url: str = typer.Option(..., help="Reward API the phase will use (C1: its executor serves π2)."),
    n: int = field_option(PreflightSize, "n"),
    prompts: int = field_option(PreflightSize, "prompts"),
    sources: str | None = typer.Option(None, help="Comma-separated sources to check (default: every source)."),
    temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature (the phase's rollout temperature)."),
    max_tokens: int = field_option(
        GenerationSettings,
        "max_tokens",
        "max_tokens per sample and greedy answer: the evaluation answer's budget (shared.EVAL_ANSWER_MAX_TOKENS), "
        "as the loop's and the experiments' preflight.",
    ),
    min_informative: float = typer.Option(0.25, min=0.0, max=1.0, help="Fail below this share of informative groups."),
    min_improvable: float = typer.Option(
        0.10, min=0.0, max=1.0, help="No headroom (fail) below this macro share of prompts whose best beats greedy."
    ),
    out: Path | None = typer.Option(None, help="Write the report JSON here."),
) -> None:
    """Before a long GRPO run: per source, the informative and improvable shares, best-of-n − greedy, invalid share."""
    from trainer.checks.preflight import advantage_check, write_report

    sources = sources or ""
    if phase not in GRPO_PHASES:
        raise bad_param("--phase", ValueError(f"must be one of {list(GRPO_PHASES)}, got {phase!r}"))
    rep = advantage_check(
        golden, reward_of(phase), policy_url, policy_model, reward_url,
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
        "improvable", help="improvable (best sample beats greedy, macro over sources) or informative (rewards differ)."
    ),
    min_share: float = typer.Option(0.10, min=0.0, max=1.0, help="Share of the criterion wanted in every phase."),
    out: Path | None = typer.Option(None, help="Write the choice (and the sweep it came from) here as JSON."),
) -> None:
    """Choose the rollout temperature from a preflight sweep: prints only the temperature (for shells)."""
    from trainer.checks.preflight import choose_temperature, read_sweep, write_report

    if criterion not in ("improvable", "informative"):
        raise bad_param("--criterion", ValueError(f"must be improvable or informative, got {criterion!r}"))
    names = [p.strip() for p in phases.split(",") if p.strip()]
    try:
        choice = choose_temperature(read_sweep(folder, names), min_share, criterion)  # type: ignore[arg-type]
    except ValueError as exc:
        raise bad_param("--dir", exc) from None
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
    min_source_share: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="Keep only sources whose improvable share is at least this (0: every source). Where few prompts "
        "are improvable, most are label noise (a gold that omits a stated column) and teach the wrong thing.",
    ),
) -> None:
    """Offline difficulty filter: keep the training prompts whose best sample beat the greedy answer."""
    from trainer.checks.preflight import FilterError, filter_improvable

    try:
        res = filter_improvable(json.loads(report.read_text()), train, out, min_source_share)
    except FilterError as exc:
        why = ValueError(f"{report}: {exc}") if exc.input_name == "report" else exc
        raise bad_param(f"--{exc.input_name.replace('_', '-')}", why) from None
    note = ""
    if res.dropped_sources is not None:
        note = f"; sources below {min_source_share}: {', '.join(res.dropped_sources) or 'none'} (dropped)"
    missing = f" ({len(res.missing)} ids not in {train})" if res.missing else ""
    typer.echo(f"{res.kept} improvable prompts -> {out}{missing}{note}")


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
    reward_url: str | None = typer.Option(None, help=f"Reward API URL (default: ${CLIENT_URL_ENV})."),
    size: int = typer.Option(16, min=4, help="Prompts trained and validated on (a multiple of 4)."),
    steps: int = typer.Option(8, min=1, help="GRPO steps."),
    margin: float = typer.Option(0.05, help="Required rise of the greedy reward (macro over data sources)."),
    dry_run: bool = typer.Option(False, help="Print the command and exit."),
) -> None:
    from trainer.checks.positive_control import ControlConfig, control_run, run_control

    overrides = no_token(ctx.args, f"trainer positive-control {phase}")
    try:
        ph = get_phase(phase)
        if ph.kind != "grpo":
            raise ValueError(f"must be a GRPO phase (b1, b2, c1, c2), got {phase!r}")
    except ValueError as exc:
        raise bad_param("PHASE", exc) from None
    try:
        cfg = ControlConfig(size=size, steps=steps, margin=margin)
        prof = check_profile(profile)
    except ValueError as exc:
        raise bad_param("--size/--steps/--margin/--profile", exc) from None
    run = control_run(
        ph, prof, prompts, out or Path("runs") / f"{ph.name}_control", model or default_model(prof), reward_url,
        cfg, overrides,
    )  # fmt: skip
    try:
        run.env()
    except ValueError as exc:
        raise bad_param("--reward-url", exc) from None
    console.print(" ".join(run.command()), markup=False)  # Hydra lists ([model,extra]) are not markup
    if dry_run:
        return
    res, verdict = run_control(run, prompts, cfg)
    console.print(verdict.reason)
    if res.monitors:
        console.print(f"{ph.name} control: {res.monitors['verdict']}")
    if not verdict.passed:
        raise typer.Exit(1)


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
    """Add ``run``, ``preflight*``, ``positive-control`` and ``export`` to the main ``python -m trainer`` app."""
    main_app.registered_commands.extend(app.registered_commands)


if __name__ == "__main__":
    app()

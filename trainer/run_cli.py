"""The recipes' commands: ``python -m trainer loop`` (with ``loop pack`` / ``loop unpack``: resume on another node,
:mod:`trainer.transfer.artifacts`) and ``python -m trainer experiment pi1-ab|pi2-ab``.

Their options are the config's fields (:mod:`trainer.runs.config`, built by :mod:`trainer.config_cli`): a field
added to a config is an option without a line here. Hydra overrides after the loop's options go to every RL phase
(after ``--rl-extra``'s). ``loop`` hands the command line to :data:`artifacts_app` when its first argument names one
of its commands (:class:`LoopCommand`). Mounted on the main app by :func:`register` (``trainer/cli.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from typer.core import TyperCommand, TyperGroup

from shared.golden import EmptySplitError, GoldenFormatError
from shared.split_overlap import SplitOverlapError
from trainer.config_cli import command_signature, given_values, set_signature
from trainer.data.train_mix import TrainMixError
from trainer.evaluation.generation import RefusedAnswersError, TruncatedAnswersError
from trainer.phases.cli import bad_param, default_model
from trainer.phases.launch import check_profile
from trainer.phases.token_overrides import TokenInOverrideError
from trainer.runs.ab import Experiment, ExperimentStopped
from trainer.runs.ab_plan import DESIGNS, Design
from trainer.runs.config import ExperimentConfig, LoopConfig, RunConfig, SftChoiceConfig, from_cli
from trainer.runs.context import REFUSALS as ENGINE_REFUSALS
from trainer.runs.loop import Loop
from trainer.runs.record import RECORD
from trainer.runs.sft_choice import HeldOutError, SftChoice
from trainer.serving.gpus import GpuPlanError, visible_gpus
from trainer.transfer import artifacts as loop_artifacts

console = Console()
app = typer.Typer(help="The RL loop.", no_args_is_help=True)
experiment_app = typer.Typer(help="The A/B experiments of the RL phases (resumable; --dry-run prints the plan).")


def to_config(config: type[RunConfig], given: dict[str, Any], **extra: Any) -> Any:
    """The config of the options given; the command line's own forms turned into the fields' values."""
    values = given_values(config, given)
    try:
        values["profile"] = check_profile(values["profile"])
    except ValueError as exc:
        raise bad_param("--profile", exc) from None
    try:
        values["gpus"] = visible_gpus(values["gpus"]) if values["profile"] == "gpu" else ()
    except GpuPlanError as exc:
        raise bad_param("--gpus", exc) from None
    values = from_cli(values)
    if config is SftChoiceConfig and not values["base_model"] and not values["dry_run"]:
        values["base_model"] = default_model(values["profile"], "--base-model")
    if config is LoopConfig and not values["base_model"] and not (values["pi1_sft"] and values["pi2_sft"]):
        values["base_model"] = default_model(values["profile"], "--base-model")
    values["rl_extra"] = (*values["rl_extra"], *extra.pop("trailing", ()))
    try:
        return config(**values, **extra)
    except TokenInOverrideError as exc:  # one line that never echoes the override's value
        raise refused(exc, code=2, what="error") from None
    except ValueError as exc:  # "field: why" (TrainMixError: "--rl-mix-share: ...")
        name = "--rl-mix-share" if isinstance(exc, TrainMixError) else str(exc).split(":", 1)[0]
        raise bad_param("--" + name.lstrip("-").replace("_", "-"), exc) from None


def say(line: str) -> None:
    console.print(line, markup=False, highlight=False)


# A refusal reaches the user as its one line, not a traceback (a Phase D whose answers were cut or refused past its
# share: its scores are written, and the line says which option allows more).
REFUSALS: tuple[type[Exception], ...] = (*ENGINE_REFUSALS, ExperimentStopped, TruncatedAnswersError,
                                         RefusedAnswersError)  # fmt: skip


def refused(exc: Exception, code: int = 1, what: str = "stopped") -> typer.Exit:
    """``exc`` as one line on stderr (``stopped: ...``); the exit to raise."""
    line = " ".join(str(exc).split())
    if isinstance(exc, (TruncatedAnswersError, RefusedAnswersError)):  # the recipes' names of Phase D's options
        for option in ("max-tokens", "max-truncated-share", "max-refused-share"):
            line = line.replace(f"(--{option})", f"(--eval-{option})")
    typer.echo(f"{what}: {line}", err=True)
    return typer.Exit(code)


def loop_cmd(ctx: typer.Context, **given: Any) -> None:
    """(A1, A2 →) B1 → B2 → C1 → C2 → Phase-D evaluation; Hydra overrides after the options apply to every RL phase.

    To go on on another node: `loop pack` the folder's finished work into pieces, `loop unpack` them there
    (see `loop pack --help`, `loop unpack --help`)."""
    cfg = to_config(LoopConfig, given, trailing=tuple(ctx.args))
    try:
        record = Loop(cfg).run()
    except (SplitOverlapError, EmptySplitError, GoldenFormatError) as exc:  # the golden preflight: one line
        typer.echo(f"error: --golden: {exc}", err=True)
        raise typer.Exit(1) from None
    except REFUSALS as exc:
        raise refused(exc) from None
    if record.get("stopped_after"):
        console.print(f"stopped after {record['stopped_after']!r} (--until); rerun to go on")
    console.print(f"record: {cfg.folder('loop') / RECORD}")
    console.print_json(json.dumps(record.get("final_decision", {})))


def experiment_cmd(design: Design) -> Any:
    def run(**given: Any) -> None:
        cfg = to_config(ExperimentConfig, given)
        exp = Experiment(design, cfg, say=say)
        if cfg.dry_run:
            typer.echo(exp.describe())
            return
        try:
            exp.run()
        except REFUSALS as exc:
            raise refused(exc) from None
        console.print(f"record: {exp.ctx.root / RECORD}")

    set_signature(run, command_signature(ExperimentConfig))
    return run


EXPERIMENT_HELP = {
    "pi1-ab": "From one π1ˢ: B1 (schema reward) vs C1 (pipeline reward, π2ˢ frozen in an executor), then Phase D "
    "(sft, local, pipe) on the test split.",
    "pi2-ab": "From one π2ˢ: B2 (gold schemas) vs C2 (schemas π1ˢ wrote), then π2 on gold schemas and Phase D "
    "end to end with π1ˢ.",
}
for _name, _design in DESIGNS.items():
    experiment_app.command(_name, help=EXPERIMENT_HELP[_name])(experiment_cmd(_design))


def sft_choice_cmd(**given: Any) -> None:
    """SFT recipes (source mixes of A1/A2's train split) compared on validation and on a leave-one-source-out check:
    each trained on every source and scored end to end on the validation split, and trained without each held-out
    source and scored on it; the choice and its rule in the run record (docs/training.md, "Choosing the SFT
    recipe")."""
    cfg = to_config(SftChoiceConfig, given)
    recipe = SftChoice(cfg, say=say)
    try:
        if cfg.dry_run:
            typer.echo(recipe.describe())
            return
        record = recipe.run()
    except HeldOutError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--held-out: "), param_hint="--held-out") from None
    except (EmptySplitError, GoldenFormatError) as exc:
        typer.echo(f"error: --golden: {exc}", err=True)
        raise typer.Exit(1) from None
    except REFUSALS as exc:
        raise refused(exc) from None
    console.print(f"record: {recipe.ctx.root / RECORD}")
    choice = record["sft_choice"]
    console.print(f"chosen: {choice['chosen']} ({choice['rule']})")


set_signature(sft_choice_cmd, command_signature(SftChoiceConfig))
experiment_app.command("sft-choice")(sft_choice_cmd)


artifacts_app = typer.Typer(help="Resume the loop on another node from its folder's finished work.")


@contextlib.contextmanager
def byte_progress(what: str) -> Iterator[loop_artifacts.Progress]:
    """A progress bar over bytes: the callback :func:`~trainer.transfer.artifacts.pack` and ``unpack`` call."""
    columns = (TextColumn(what), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda n, total: bar.update(task, advance=n, total=total)


def artifact_failure(exc: loop_artifacts.ArtifactError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


@artifacts_app.command("pack")
def pack_cmd(
    workdir: Path = typer.Option(..., help="The loop folder (`trainer loop --out`).", exists=True, file_okay=False),
    out: Path = typer.Option(..., help="Folder for the pieces and artifacts.json (new or empty)."),
    piece_mib: float = typer.Option(15.0, min=0.001, help="A piece's size at most, in MiB."),
    batch_pieces: int = typer.Option(
        loop_artifacts.DEFAULT_BATCH_PIECES, min=1, help="Pieces per batch folder (what one transfer carries)."
    ),
) -> None:
    """Pack the finished phases' exports and results, the data, Phase D's scores and the manifest into checked
    pieces (no checkpoints, no logs)."""
    try:
        with byte_progress("pack") as progress:
            rec = loop_artifacts.pack(workdir, out, int(piece_mib * 2**20), batch_pieces, progress)
    except loop_artifacts.ArtifactError as exc:
        raise artifact_failure(exc) from None
    size = sum(f["size"] for f in rec["files"])
    batches = len({p["batch"] for p in rec["pieces"]})
    console.print(
        f"{len(rec['files'])} files ({size / 2**20:.1f} MiB) of {len(rec['models'])} finished phases in "
        f"{len(rec['pieces'])} pieces of at most {rec['piece_bytes']} bytes, {batches} batch folders: {out}"
    )
    console.print(f"carry {out / loop_artifacts.ARTIFACTS} with them; `trainer loop unpack` rebuilds the folder")


@artifacts_app.command("unpack")
def unpack_cmd(
    pieces: Path = typer.Option(
        ..., help="Folder with artifacts.json and the pieces (anywhere under it).", exists=True, file_okay=False
    ),
    workdir: Path = typer.Option(..., help="The new loop folder (new or empty)."),
) -> None:
    """Check every piece and file by sha256, rebuild the loop folder as WORKDIR with its recorded paths moved
    there; `trainer loop --out WORKDIR` with the first run's options then goes on from it."""
    try:
        with byte_progress("unpack") as progress:
            entry = loop_artifacts.unpack(pieces, workdir, progress)
    except loop_artifacts.ArtifactError as exc:
        raise artifact_failure(exc) from None
    console.print(f"{workdir}: unpacked from {entry['from']} ({entry['pieces']} pieces, every file checked)")
    console.print(f"paths rewritten in {len(entry['rewritten'])} files; go on with `trainer loop --out {workdir} ...`")


class LoopCommand(TyperCommand):
    """``loop``, which hands its command line to :data:`artifacts_app` when the first argument names one of its
    commands (``loop pack ...``): the loop's required options and trailing overrides stay as they are."""

    # the contexts are those of typer's own click, whose types typer does not export: Any
    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        group = typer.main.get_command(artifacts_app)
        if args and isinstance(group, TyperGroup) and args[0] in group.commands:
            return group.make_context(info_name, list(args), parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
set_signature(loop_cmd, command_signature(LoopConfig, ctx_param))
app.command("loop", cls=LoopCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    loop_cmd
)


def register(main_app: typer.Typer) -> None:
    """Add ``loop`` (with ``loop pack`` and ``loop unpack``) and ``experiment`` to the main ``python -m trainer``."""
    main_app.registered_commands.extend(app.registered_commands)
    main_app.add_typer(experiment_app, name="experiment")

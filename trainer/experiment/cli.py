"""``python -m trainer experiment pi1-ab|pi2-ab``: one command per design, its options built from
:class:`~trainer.experiment.config.ExperimentConfig`'s fields (:mod:`trainer.config_cli`). Mounted on the
main app by :func:`register` (``trainer/cli.py``)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from trainer.config_cli import command_signature, given_values, set_signature
from trainer.experiment.config import ExperimentConfig
from trainer.experiment.design import DESIGNS, Design
from trainer.experiment.recipe import Experiment, ExperimentStopped
from trainer.phases.cli import bad_param
from trainer.phases.launch import check_profile
from trainer.runs.reuse import StaleResultError
from trainer.serving.gpus import GpuPlanError, visible_gpus

console = Console()
app = typer.Typer(help="The A/B experiments of the RL phases, as recipes (resumable; --dry-run prints the plan).")


def to_config(given: dict[str, Any]) -> ExperimentConfig:
    """The config of the options given; the command line's own forms turned into the fields' values."""
    values = given_values(ExperimentConfig, given)
    try:
        values["profile"] = check_profile(values["profile"])
    except ValueError as exc:
        raise bad_param("--profile", exc) from None
    try:
        values["gpus"] = visible_gpus(values["gpus"]) if values["profile"] == "gpu" else ()
    except GpuPlanError as exc:
        raise bad_param("--gpus", exc) from None
    try:
        return ExperimentConfig.from_cli(**values)
    except ValueError as exc:
        param = str(exc).split(":", 1)[0].lstrip("-").replace("_", "-")
        raise bad_param(f"--{param}", exc) from None


def say(line: str) -> None:
    console.print(line, markup=False, highlight=False)


def command(design: Design) -> Any:
    def run(**given: Any) -> None:
        cfg = to_config(given)
        exp = Experiment(design, cfg, say=say)
        if cfg.dry_run:
            typer.echo(exp.describe())
            return
        try:
            exp.run()
        except (ExperimentStopped, StaleResultError) as stop:
            say(f"stopped: {stop}")
            raise typer.Exit(1) from None
        console.print(f"manifest: {exp.wd.manifest}")

    set_signature(run, command_signature(ExperimentConfig))
    return run


HELP = {
    "pi1-ab": "From one π1ˢ: B1 (schema reward) vs C1 (pipeline reward, π2ˢ frozen in an executor), then Phase D "
    "(sft, local, pipe) on the test split.",
    "pi2-ab": "From one π2ˢ: B2 (gold schemas) vs C2 (schemas π1ˢ wrote), then π2 on gold schemas and Phase D "
    "end to end with π1ˢ.",
}
for _name, _design in DESIGNS.items():
    app.command(_name, help=HELP[_name])(command(_design))


def register(main_app: typer.Typer) -> None:
    """Add ``experiment`` (with ``pi1-ab`` and ``pi2-ab``) to the main ``python -m trainer`` app."""
    main_app.add_typer(app, name="experiment")

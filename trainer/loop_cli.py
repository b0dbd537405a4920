"""``python -m trainer loop``: the loop's command, beside the loop (``trainer/loop/``).

Its options are :class:`~trainer.loop.config.LoopConfig`'s fields, built from the field declarations by
:mod:`trainer.config_cli` (help text, Typer's checks, and where the command line differs from the field,
its name, type and default): a field added to the config is an option without a line here. Hydra overrides after the
options go to every RL phase (``overrides``, the one field that is not an option). Mounted on the main
app by :func:`register` (``trainer/cli.py``).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import typer
from rich.console import Console

from trainer.config_cli import command_signature, csv_values, given_values, set_signature
from trainer.loop import PARTS, Loop, LoopConfig
from trainer.phases.cli import bad_param, default_model
from trainer.phases.launch import check_profile
from trainer.phases.train_mix import TrainMixError
from trainer.serving.gpus import GpuPlanError, visible_gpus

console = Console()
app = typer.Typer(help="The RL loop.", no_args_is_help=True)


def to_config(ctx: typer.Context, given: dict[str, Any]) -> LoopConfig:
    """The config of the options given; the command line's own forms are turned into the fields' values."""
    values = given_values(LoopConfig, given)
    try:
        values["profile"] = check_profile(values["profile"])
    except ValueError as exc:
        raise bad_param("--profile", exc) from None
    until = values["until"]
    if until is not None and until not in PARTS:
        raise bad_param("--until", ValueError(f"must be one of {list(PARTS)}, got {until!r}"))
    try:
        values["gpus"] = visible_gpus(values["gpus"]) if values["profile"] == "gpu" else ()
    except GpuPlanError as exc:
        raise bad_param("--gpus", exc) from None
    if not values["base_model"] and not (values["pi1_sft"] and values["pi2_sft"]):
        values["base_model"] = default_model(values["profile"], "--base-model")
    values["sft_overrides"] = tuple(values["sft_overrides"])
    values["rl_sources"] = csv_values(values["rl_sources"])
    values["executor_eager"] = not values["executor_eager"]  # the option is --executor-cuda-graphs
    try:
        return LoopConfig(**values, overrides=tuple(ctx.args))
    except TrainMixError as exc:
        raise bad_param("--rl-mix-share", exc) from None


def loop_cmd(ctx: typer.Context, **given: Any) -> None:
    """(A1, A2 →) B1 → B2 → C1 → C2 → Phase-D evaluation; Hydra overrides after the options apply to every RL phase."""
    cfg = to_config(ctx, given)
    manifest = Loop(cfg).run()
    if manifest.get("stopped_after"):
        console.print(f"stopped after {manifest['stopped_after']!r} (--until); rerun to go on")
    console.print(f"manifest: {cfg.out / 'loop_manifest.json'}")
    console.print_json(json.dumps(manifest.get("final_decision", {})))


ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
set_signature(loop_cmd, command_signature(LoopConfig, ctx_param))
app.command("loop", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(loop_cmd)


def register(main_app: typer.Typer) -> None:
    """Add ``loop`` to the main ``python -m trainer`` app."""
    main_app.registered_commands.extend(app.registered_commands)

"""``python -m trainer run``'s folders from the environment, as a container sets them (the compose ``trainer``
service and the Kubernetes trainer Job: TRAINER_DATA_DIR, TRAINER_ACTOR_MODEL_PATH, TRAINER_OUTPUT_DIR)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from trainer.cli import app

URL = {"REWARD_API_URL": "http://127.0.0.1:8000", "COLUMNS": "400"}


def dry_run(*args: str, **env: str) -> str:
    res = CliRunner().invoke(app, ["run", "c1", "--dry-run", *args], env={**URL, **env})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())  # rich wraps at its own width, whatever COLUMNS says


def test_folders_from_the_environment(tmp_path: Path) -> None:
    out = dry_run(TRAINER_DATA_DIR=str(tmp_path / "d"), TRAINER_ACTOR_MODEL_PATH="/models/actor",
                  TRAINER_OUTPUT_DIR=str(tmp_path / "o"))  # fmt: skip
    assert f"c1: data {tmp_path / 'd'}, model /models/actor, out {tmp_path / 'o' / 'c1'}" in out


def test_options_win_over_the_environment(tmp_path: Path) -> None:
    out = dry_run("--data", "D", "--model", "M", "--out", "O", TRAINER_DATA_DIR=str(tmp_path),
                  TRAINER_ACTOR_MODEL_PATH="/models/actor", TRAINER_OUTPUT_DIR=str(tmp_path))  # fmt: skip
    assert "c1: data D, model M, out O" in out


def test_defaults_without_the_environment() -> None:
    out = dry_run("--model", "M", TRAINER_DATA_DIR="", TRAINER_OUTPUT_DIR="")
    assert "c1: data data, model M, out runs/c1" in out


def test_gpu_profile_still_needs_a_model() -> None:
    res = CliRunner().invoke(app, ["run", "c1", "--dry-run"], env={**URL, "TRAINER_ACTOR_MODEL_PATH": ""})
    assert res.exit_code == 2 and "required with --profile gpu" in res.output


def test_the_printed_command_keeps_hydra_lists() -> None:
    """Rich would read ``[model,extra]`` as markup and print ``checkpoint.save_contents=``."""
    out = dry_run("--model", "M", "checkpoint.save_contents=[model,extra]")
    assert "checkpoint.save_contents=[model,extra]" in out

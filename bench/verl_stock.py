"""VERL's own GRPO trainer on B1's work: the ``verl_stock`` row of ``python -m bench rl-step``.

The peer a user would pick instead of this project's trainer: ``python -m verl.trainer.main_ppo`` with VERL's
defaults for everything the row does not fix. Fixed, so that both rows do the same work: the model, B1's
parquet (``<data>/b1/{train,validation}.parquet``), the batch (64 prompts, mini batches of 8), ``n``, the
prompt and response lengths, the training prompts (4,096), one GPU, and what this machine needs to run it at
all: sdpa attention without packing (no flash-attn wheel), micro batches of 64 (VERL has no default), no
Ray dashboard. The reward is B1's schema reward (:func:`shared.rewards.compute_schema_reward_single`, the
reward API's default config) computed in VERL's reward workers by :func:`compute_score`, this module being
the ``custom_reward_function``: no reward service in between.

``python -m bench.verl_stock --data DIR --model DIR --out DIR [--steps N] [--batch B] [--n K] [-- OVERRIDE...]``
runs it (from the repository root) with VERL's file logger at ``<out>/metrics.jsonl``, its output in
``<out>/train.log`` and the command in ``<out>/command.sh``: the layout of a phase folder that
:mod:`bench.rl_step` reads.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from shared.limits import SCHEMA_ANSWER_MAX_TOKENS
from shared.rewards import compute_schema_reward_single

REPO = Path(__file__).resolve().parents[1]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **_: Any
) -> dict[str, float]:
    """``{"score", "valid_json", "f1"}`` of one predicted schema against the parquet's gold schema."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(truth, dict) or "schema" not in truth:
        raise ValueError(f"ground_truth of {data_source!r}: a JSON object with 'schema' expected")
    r = compute_schema_reward_single(solution_str, truth["schema"])
    return {"score": float(r.reward), "valid_json": float(r.valid_json), "f1": float(r.f1)}


def overrides(
    data: Path, model: Path, out: Path, steps: int, batch: int = 64, n: int = 16, gpus: int = 1
) -> list[str]:
    """The Hydra overrides of the row: what it fixes, nothing else."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'b1' / 'train.parquet'}",
        f"data.val_files={data / 'b1' / 'validation.parquet'}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=512",
        f"data.max_response_length={SCHEMA_ANSWER_MAX_TOKENS}",
        "data.filter_overlong_prompts=true",
        "data.train_max_samples=4096",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={gpus}",  # VERL's default 2 needs two GPUs
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.n_gpus_per_node={gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=bench",
        "trainer.experiment_name=verl_stock",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
    ]


def main(
    data: Path = typer.Option(..., exists=True, file_okay=False, help="`trainer data build` output (b1/ inside)."),
    model: Path = typer.Option(..., exists=True, file_okay=False, help="The policy (B1's π1, an HF folder)."),
    out: Path = typer.Option(..., help="The run's folder: command.sh, train.log, metrics.jsonl."),
    steps: int = typer.Option(6, min=1, help="Training steps."),
    batch: int = typer.Option(64, min=1, help="Prompts a step."),
    n: int = typer.Option(16, min=2, help="Samples a prompt."),
    gpus: int = typer.Option(1, min=1, help="GPUs of the node."),
    extra: list[str] = typer.Argument(None, help="More Hydra overrides, after --."),
) -> None:
    """Run VERL's own trainer on B1's work; exits with its exit code."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(data, model, out, steps, batch, n, gpus),
           *(extra or [])]  # fmt: skip
    (out / "command.sh").write_text(shlex.join(cmd) + "\n")
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str((out / "metrics.jsonl").resolve())}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    with (out / "train.log").open("ab") as log:
        rc = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    raise typer.Exit(rc)


if __name__ == "__main__":
    typer.run(main)

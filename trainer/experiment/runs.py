"""The phase runs an experiment launches (SFT, the two RL arms, the positive control), as pure functions
of its config, its placement and the chosen temperature: what ``--dry-run`` prints is what runs.

RL settings of both arms: the profile's hyper-parameters, ``--rl-steps`` steps,
validation (and a checkpoint) every ``--rl-test-freq`` steps, a random 2,048-prompt subset of the train
split (VERL's seed, so the dataset is not tokenised whole at start), epochs enough that the step count ends
the run (an improvable set of 152 prompts ran out after 6 steps at grpo_base's 3), the chosen rollout
temperature. On GPUs also: the placement's GPU count, eager vLLM rollout (no compile at start), a fifth of
the card for the rollout (two trainers and executors share it), Ray on loopback (the node has no network),
micro batches of ``--rl-micro`` samples (a mini batch of 8 prompts x 16 is 128 samples on one GPU; the
profile's 16, sized for 8 GPUs, made 64 passes a step, update_actor 25-35 s of a 43-73 s step with the GPU
nearly idle); one transfer-queue storage unit comes from the gpu profile. ``--rl-extra`` comes last and wins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from trainer.experiment.config import ExperimentConfig
from trainer.phases.launch import CONFIG_DIR, PhaseRun, Profile
from trainer.phases.positive_control import ControlConfig
from trainer.phases.positive_control import control_run as phase_control_run
from trainer.phases.registry import get_phase
from trainer.phases.seeds import rl_seed_overrides
from trainer.phases.train_mix import mixed_set_path, mixes
from trainer.phases.train_set import count_prompts
from trainer.serving.gpus import Placement

TRAIN_MAX_SAMPLES = 2048
EPOCHS = 100


def gpu_overrides(placement: Placement | None) -> tuple[str, ...]:
    """What a placement on GPUs adds to a GRPO run (nothing on CPU: the cpu-smoke profile has its own)."""
    if placement is None:
        return ()
    return (
        *placement.grpo_overrides(),
        "actor_rollout_ref.rollout.enforce_eager=true",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
    )


def rl_overrides(cfg: ExperimentConfig, temperature: float | str, placement: Placement | None) -> tuple[str, ...]:
    """Both arms' settings (the module's docstring says why each)."""
    every = min(cfg.rl_test_freq, cfg.rl_steps)
    micro = cfg.rl_micro
    on_gpu = () if placement is None else (
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
    )  # fmt: skip
    return (
        *gpu_overrides(placement),
        *on_gpu,
        f"trainer.total_training_steps={cfg.rl_steps}",
        f"trainer.test_freq={every}",
        f"trainer.save_freq={every}",
        f"data.train_max_samples={TRAIN_MAX_SAMPLES}",
        f"trainer.total_epochs={EPOCHS}",
        f"actor_rollout_ref.rollout.temperature={temperature}",
        *rl_seed_overrides(cfg.rl_seed),
    )


def placed_overrides(cfg: ExperimentConfig, temperature: float | str, placement: Placement | None) -> tuple[str, ...]:
    """What a GPU placement adds to an arm's overrides (not an input of what it learns: trainer.runs.reuse)."""
    off_gpu = set(rl_overrides(cfg, temperature, None))
    return tuple(o for o in rl_overrides(cfg, temperature, placement) if o not in off_gpu)


def train_batch_size(profile: Profile, overrides: Sequence[str] = ()) -> int:
    """``data.train_batch_size`` of a GRPO run: the last override that sets it, else the profile's."""
    for item in reversed(overrides):
        if m := re.fullmatch(r"\+*data\.train_batch_size=(\d+)", item.strip()):
            return int(m.group(1))
    profile_yaml = yaml.safe_load((CONFIG_DIR / "profile" / f"{profile}.yaml").read_text())
    return int(profile_yaml["data"]["train_batch_size"])


def improvable_train_files(cfg: ExperimentConfig, phase: str, improvable: Path) -> tuple[str | None, str]:
    """``--rl-improvable``: the override that trains ``phase`` on its improvable prompts where they fill one
    batch (VERL drops a partial batch: an epoch of no step), else None and why it trains on the train split
    (on its ``--rl-sources`` prompts where given)."""
    if not cfg.rl_improvable:
        return None, ""
    instead = f"training on its {','.join(cfg.rl_sources)} prompts" if cfg.rl_sources else "training on the train split"
    if not improvable.is_file():
        return None, f"{phase}: no improvable prompt set (not swept); {instead}"
    n, batch = count_prompts(str(improvable)), train_batch_size(cfg.profile, cfg.rl_extra)
    if n < batch:
        return None, f"{phase}: {n} improvable prompts in {improvable}, fewer than a batch of {batch}; {instead}"
    return f"data.train_files={improvable}", f"{phase}: training on its {n} improvable prompts ({improvable})"


def source_train_files(cfg: ExperimentConfig, phase: str, source_set: Path) -> tuple[str | None, str]:
    """``--rl-sources``: the override that trains ``phase`` on its train split's prompts of those sources
    (``source_set``, written by the rl stage before the arms start), and what it says; (None, "") without."""
    if not cfg.rl_sources:
        return None, ""
    n = f"its {count_prompts(str(source_set))}" if source_set.is_file() else "the"
    why = f"{phase}: training on {n} {','.join(cfg.rl_sources)} prompts ({source_set})"
    return f"data.train_files={source_set}", why


def chosen_path(files: str | None) -> Path | None:
    """The file of a ``data.train_files=`` override (None: the phase's train split)."""
    return Path(files.split("=", 1)[1]) if files else None


def mixed_train_files(cfg: ExperimentConfig, phase: str, files: str | None, folder: Path) -> tuple[str | None, str]:
    """``--rl-mix-share``: the override that trains ``phase`` on its chosen set (``files``) with the other
    sources' share mixed in (written by the rl stage into ``folder``), and what it says; ``files`` unchanged
    where the phase is not mixed (no share, no chosen set, C2)."""
    chosen = chosen_path(files)
    if chosen is None or not cfg.rl_mix_share:
        return files, ""
    if not mixes(get_phase(phase).built_from_golden, cfg.rl_mix_share):
        return files, f"{phase}: not mixed (its train split holds π1ˢ's schemas of its chosen documents only)"
    out = mixed_set_path(folder, chosen)
    return f"data.train_files={out}", f"{phase}: {cfg.rl_mix_share:g} of its prompts from the other sources ({out})"


def sft_run(
    cfg: ExperimentConfig, phase: str, model: str, out: Path, data: Path, placement: Placement | None
) -> PhaseRun:
    return PhaseRun(
        phase=get_phase(phase),
        profile=cfg.profile,
        data_dir=data,
        out_dir=out,
        model_path=model,
        overrides=(*(placement.sft_overrides() if placement else ()), *cfg.sft_overrides),
        nproc=placement.nproc if placement else 1,
        gpus=placement.gpus if placement else (),
        placed=placement.sft_overrides() if placement else (),
    )


def arm_run(
    cfg: ExperimentConfig,
    phase: str,
    model: str,
    reward_url: str,
    out: Path,
    data: Path,
    placement: Placement | None,
    temperature: float | str,
    train_files: str | None = None,
    reward_model: str | None = None,
) -> PhaseRun:
    """One RL arm: the experiment's settings, its train files (``--rl-improvable``), then ``--rl-extra``;
    ``reward_model``: the model behind its reward (C1: the frozen π2ˢ)."""
    return PhaseRun(
        phase=get_phase(phase),
        profile=cfg.profile,
        data_dir=data,
        out_dir=out,
        model_path=model,
        reward_url=reward_url,
        overrides=(*rl_overrides(cfg, temperature, placement), *((train_files,) if train_files else ()), *cfg.rl_extra),
        nproc=placement.nproc if placement else 1,
        gpus=placement.gpus if placement else (),
        placed=placed_overrides(cfg, temperature, placement),
        reward_model=reward_model,
    )


def control_run(
    cfg: ExperimentConfig,
    phase: str,
    model: str,
    reward_url: str,
    prompts: Path,
    out: Path,
    placement: Placement | None,
    temperature: float | str,
) -> tuple[PhaseRun, ControlConfig]:
    """The positive control of arm A (:mod:`trainer.phases.positive_control`): its own steps and validation
    schedule, with this placement and the chosen temperature (not the arms' settings, which would override
    the control's)."""
    ccfg = ControlConfig()
    extra = (*gpu_overrides(placement), f"actor_rollout_ref.rollout.temperature={temperature}")
    run = phase_control_run(get_phase(phase), cfg.profile, prompts, out, model, reward_url, ccfg, extra)
    if placement is not None:
        run = replace(run, gpus=placement.gpus, nproc=placement.nproc)
    return run, ccfg

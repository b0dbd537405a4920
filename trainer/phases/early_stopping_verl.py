"""VERL hook of early stopping: a registered V1 trainer whose ``_validate`` decides to stop.

Why this hook: in VERL 0.9.1 every validation of ``PPOTrainer.fit`` goes through ``_validate()``
(``val_before_train`` and every ``test_freq`` step), and the loop runs ``while global_steps <=
total_training_steps``. Lowering ``total_training_steps`` to the current step when patience runs
out ends the loop after this step's logging, through VERL's own exit path (``on_train_end``,
dump-executor shutdown, tracking finish) — the run really stops, nothing is killed. Checkpoints
are saved before validation on the same steps (``save_freq == test_freq``), so the best
validated step always has a checkpoint; the others are pruned (the latest is kept for resume).

Select it with ``trainer.v1.trainer_mode=sync_early_stop`` and run through
:mod:`trainer.phases.verl_main`, whose Ray task runner imports this module in the trainer process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from trainer.phases.early_stopping import STATE_FILE, Decision, EarlyStopper, EarlyStoppingConfig, prune_checkpoints

TRAINER_MODE = "sync_early_stop"
log = logging.getLogger(__name__)


def stopper_from_config(config: DictConfig) -> EarlyStopper:
    """The phase's stopper; its state file sits next to the checkpoints (resume-safe)."""
    raw = OmegaConf.to_container(config.early_stopping, resolve=True)
    assert isinstance(raw, dict)
    cfg = EarlyStoppingConfig.from_mapping({str(k): v for k, v in raw.items()})
    if cfg.enabled and int(config.trainer.save_freq) != int(config.trainer.test_freq):
        raise ValueError(
            "early_stopping: trainer.save_freq must equal trainer.test_freq so every validated step has a "
            f"checkpoint (got save_freq={config.trainer.save_freq}, test_freq={config.trainer.test_freq})"
        )
    return EarlyStopper(cfg, Path(str(config.trainer.default_local_dir)) / STATE_FILE)


def apply_decision(trainer: Any, decision: Decision) -> None:
    """Make VERL's loop end after the current step (it checks ``global_steps <= total_training_steps``)."""
    if decision.stop and decision.step > 0:
        trainer.total_training_steps = min(int(trainer.total_training_steps), decision.step)


@register_trainer(TRAINER_MODE)
class EarlyStoppingPPOTrainer(PPOTrainerSync):
    """PPOTrainerSync plus early stopping on the phase's validation score."""

    def __init__(self, config: DictConfig) -> None:
        super().__init__(config)
        self.early_stopper = stopper_from_config(config)

    def _validate(self) -> dict[str, float]:
        metrics: dict[str, float] = super()._validate()
        step = int(self.global_steps)
        decision = self.early_stopper.update(step, metrics)
        metrics.update(decision.as_metrics())
        apply_decision(self, decision)
        if step > 0:
            ckpt_dir = Path(str(self.config.trainer.default_local_dir))
            removed = prune_checkpoints(ckpt_dir, keep={decision.best_step, step})
            if removed:
                log.info("early stopping: pruned checkpoints %s (best %s)", removed, decision.best_step)
        if decision.stop:
            print(
                f"[early_stopping] stop at step {step}: no gain > {self.early_stopper.cfg.min_delta} for "
                f"{decision.bad_evals} validations; best step {decision.best_step} "
                f"(score {decision.best_score:.4f})",
                flush=True,
            )
        return metrics

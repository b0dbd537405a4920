"""VERL entry point of the GRPO phases: ``python -m trainer.in_verl.verl_main --config-name c1_grpo ...``.

It is VERL 0.9.1's ``main_ppo`` with four differences: the configs are this project's phase files
(``trainer/phases/configs``, composed on top of VERL's ``ppo_trainer``); the prompt length filter runs
here, once per file and tokenizer (:mod:`trainer.data.prompt_filter`); gradient checkpointing and the
micro batches the config leaves null are chosen by the policy's size (:mod:`trainer.phases.sizing`);
and the Ray task runner first
calls :func:`trainer.in_verl.phase_trainer.install`, so that in the process that builds the
trainer, VERL's ``trainer_mode=sync`` builds :class:`~trainer.in_verl.phase_trainer.PhaseTrainer` (VERL's
``PPOTrainerSync`` with early stopping, the failure policy and the monitors) while every
``trainer_mode == "sync"`` branch of VERL still applies. Use ``python -m trainer run <phase>`` rather than this.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import ray
from omegaconf import DictConfig
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

from trainer.data import prompt_filter
from trainer.in_verl import vllm_executor
from trainer.phases import sizing
from trainer.phases.launch import CONFIG_DIR


class _PhaseTaskRunner(TaskRunnerV1.__ray_actor_class__):  # type: ignore[misc, name-defined]
    def run(self, config: DictConfig) -> Any:
        from trainer.in_verl.phase_trainer import install

        install(config)
        return super().run(config)


PhaseTaskRunner = ray.remote(num_cpus=1)(_PhaseTaskRunner)


# by absolute path: the configs sit with the phases, not beside this module
@hydra.main(config_path=str(CONFIG_DIR), config_name="c1_grpo", version_base=None)
def main(config: DictConfig) -> None:
    from trainer.data.train_set import check_fills_a_batch

    # before Ray and the workers start: a prompt set that cannot fill one batch fails here, by name
    check_fills_a_batch(config.data.train_files, config.data.train_batch_size, config.data.get("train_max_samples"))
    # the prompt length filter once per file and tokenizer (cached), instead of in every phase's TaskRunner
    ckpt_dir = Path(str(config.trainer.default_local_dir))
    try:
        filtered = prompt_filter.apply(config, ckpt_dir.parent / "prompts")
    except prompt_filter.AllTooLong as exc:  # the launcher's phase_result.json takes the record's error
        prompt_filter.record(ckpt_dir, [], error=str(exc))
        raise SystemExit(f"[prompt_filter] error: {exc}") from None
    if filtered is not None:
        for split in filtered:
            print(split.describe(), flush=True)
        prompt_filter.record(ckpt_dir, filtered)
    # gradient checkpointing and micro batches by the policy's size, where the config leaves them null
    chosen = sizing.apply(config)
    if chosen is not None:
        print(chosen.describe(), flush=True)
        sizing.record(config, chosen)
    executor_note = vllm_executor.apply(config)
    if executor_note:
        print(executor_note, flush=True)
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    run_ppo(config, task_runner_class=PhaseTaskRunner)


if __name__ == "__main__":
    main()

"""The GPU profiles hold the learning run's hyper-parameters (issue 12), and the CPU smoke keeps its own."""

from __future__ import annotations

import pytest

from tests.trainer.phases.test_launch import composed, env  # noqa: F401  (env is a fixture)


@pytest.mark.parametrize(("phase", "response"), [("b1", 256), ("c1", 256), ("b2", 512), ("c2", 512)])
def test_grpo_gpu_hyper_parameters(env: None, phase: str, response: int) -> None:  # noqa: F811
    c = composed(f"{phase}_grpo", "profile=gpu")
    assert c.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-5)
    assert c.actor_rollout_ref.rollout.n == 8 and c.actor_rollout_ref.rollout.temperature == 1.0
    assert c.data.train_batch_size == 64 and c.data.max_response_length == response
    assert c.actor_rollout_ref.actor.use_kl_loss and c.actor_rollout_ref.actor.kl_loss_coef == pytest.approx(1e-3)
    assert "tensorboard" in c.trainer.logger and "file" in c.trainer.logger
    # sdpa without packing: packed micro batches make sdpa attend over the whole pack
    assert c.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert c.actor_rollout_ref.model.use_remove_padding is False
    assert c.trainer.test_freq == c.trainer.save_freq == 5
    # early stopping validates on a fixed subset of the validation split; one node, Ray on loopback
    assert c.data.val_max_samples == 512 and c.data.val_files.endswith("validation.parquet")
    assert c.data.train_max_samples == 4096 and c.data.train_files.endswith("train.parquet")
    assert c.actor_rollout_ref.rollout.enforce_eager is True
    assert c.ray_kwargs.ray_init.include_dashboard is False and "_node_ip_address" not in c.ray_kwargs.ray_init
    # the mini batch divides the samples of a step, and the micro batch divides the mini batch
    samples = c.data.train_batch_size * c.actor_rollout_ref.rollout.n
    mini = c.actor_rollout_ref.actor.ppo_mini_batch_size
    assert samples % mini == 0 and mini % c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 0


@pytest.mark.parametrize("phase", ["b1", "b2", "c1", "c2"])
def test_cpu_smoke_keeps_its_toy_sizes(env: None, phase: str) -> None:  # noqa: F811
    c = composed(f"{phase}_grpo", "profile=cpu-smoke")
    assert c.data.max_response_length == 128 and c.actor_rollout_ref.rollout.n == 2
    assert "tensorboard" not in c.trainer.logger


@pytest.mark.parametrize("phase", ["a1", "a2"])
def test_sft_gpu_matches_the_hf_baseline_budget(env: None, phase: str) -> None:  # noqa: F811
    c = composed(f"{phase}_sft", "sft_profile=gpu")
    assert c.optim.lr == pytest.approx(1e-4) and c.optim.lr_scheduler_type == "cosine"
    assert c.trainer.total_epochs == 1 and c.data.train_batch_size == 32
    assert c.model.override_config.attn_implementation == "sdpa" and c.model.use_remove_padding is False
    assert c.data.use_dynamic_bsz is False and c.model.enable_gradient_checkpointing is False
    assert "tensorboard" in c.trainer.logger


def test_tensorboard_writes_under_the_phase_folder(tmp_path: object) -> None:
    from pathlib import Path

    from trainer.phases.launch import PhaseRun, get_phase

    out = Path(str(tmp_path)) / "c1"
    run = PhaseRun(get_phase("c1"), "gpu", Path("/data"), out, "/m", reward_url="http://127.0.0.1:1")
    assert run.env({})["TENSORBOARD_DIR"] == str((out / "tensorboard").resolve())

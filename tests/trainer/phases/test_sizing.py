"""Gradient checkpointing and micro batches chosen by the policy's size (trainer/phases/sizing.py), on the
command line ``trainer run`` builds for the gpu profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.phases.test_gpu_profile import composed_command, gpu_run
from tests.trainer.phases.test_launch import env  # noqa: F401  (a fixture)
from trainer.phases import sizing

# SmolLM2-135M-Instruct's config.json (the project's default model), the fields the count reads
SMOLLM2_135M = {
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip
# Qwen2.5-7B's shape
SEVEN_B = {
    "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip


def write_model_config(model_dir: Path, fields: dict[str, Any] | None = None) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(fields or SMOLLM2_135M))
    return model_dir


def test_parameter_count_matches_the_published_sizes() -> None:
    assert sizing.count_params(SMOLLM2_135M) == 134_479_872  # "135M"
    assert 7.0e9 < sizing.count_params(SEVEN_B) < 7.7e9  # Qwen2.5-7B: 7.6B
    with pytest.raises(ValueError, match="hidden_size is missing"):
        sizing.count_params({"num_hidden_layers": 2, "vocab_size": 10})


@pytest.mark.parametrize(
    ("params", "per_gpu", "checkpointing", "micro"),
    [(135e6, 64, False, 64), (135e6, 128, False, 64), (135e6, 32, False, 32), (135e6, 48, False, 48),
     (3e9, 64, True, 16), (7.6e9, 64, True, 16), (14e9, 64, True, 4), (135e6, 96, False, 48), (135e6, 7, False, 7)],
)  # fmt: skip
def test_rule(params: float, per_gpu: int, checkpointing: bool, micro: int) -> None:
    got = sizing.choose(int(params), per_gpu, sizing.SizingRule())
    assert (got.gradient_checkpointing, got.micro_batch) == (checkpointing, micro)
    assert per_gpu % got.micro_batch == 0


@pytest.mark.parametrize(("gpus", "micro"), [(1, 64), (2, 64), (4, 32), (8, 16)])
def test_the_gpu_command_line_gets_no_checkpointing_and_large_micro_batches_for_135m(
    env: None,  # noqa: F811
    tmp_path: Path,
    gpus: int,
    micro: int,
) -> None:
    c = composed_command(gpu_run("b1", f"trainer.n_gpus_per_node={gpus}",
                                 f"actor_rollout_ref.model.path={write_model_config(tmp_path / 'm')}"))  # fmt: skip
    chosen = sizing.apply(c)
    assert chosen is not None and chosen.per_gpu_samples == 128 // gpus
    arr = c.actor_rollout_ref
    assert arr.model.enable_gradient_checkpointing is False
    assert arr.actor.ppo_micro_batch_size_per_gpu == micro
    assert arr.ref.log_prob_micro_batch_size_per_gpu == arr.rollout.log_prob_micro_batch_size_per_gpu == micro
    c.trainer.default_local_dir = str(tmp_path / "ckpt")
    rec = json.loads(sizing.record(c, chosen).read_text())
    assert rec["choice"]["micro_batch"] == micro and rec["ran_with"][sizing.CHECKPOINTING_KEY] is False


def test_a_7b_policy_recomputes_activations(env: None, tmp_path: Path) -> None:  # noqa: F811
    model = write_model_config(tmp_path / "m", SEVEN_B)
    c = composed_command(gpu_run("c1", "trainer.n_gpus_per_node=2", f"actor_rollout_ref.model.path={model}"))
    sizing.apply(c)
    assert c.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 16


def test_values_the_user_sets_are_kept_and_auto_off_leaves_everything(env: None, tmp_path: Path) -> None:  # noqa: F811
    model = write_model_config(tmp_path / "m")
    c = composed_command(gpu_run("b1", f"actor_rollout_ref.model.path={model}",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                                 "actor_rollout_ref.model.enable_gradient_checkpointing=true"))  # fmt: skip
    sizing.apply(c)
    assert c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    assert c.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert c.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 16  # 128 samples / 8 GPUs, filled
    off = composed_command(gpu_run("b1", f"actor_rollout_ref.model.path={model}", "sizing.auto=false"))
    assert sizing.apply(off) is None and off.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is None


def test_errors_name_the_setting(env: None, tmp_path: Path) -> None:  # noqa: F811
    c = composed_command(gpu_run("b1", f"actor_rollout_ref.model.path={tmp_path / 'none'}"))
    with pytest.raises(ValueError, match=r"config\.json not found"):
        sizing.apply(c)
    c = composed_command(gpu_run("b1", f"actor_rollout_ref.model.path={write_model_config(tmp_path / 'm')}",
                                 "trainer.n_gpus_per_node=3"))  # fmt: skip
    with pytest.raises(ValueError, match="does not split over 3 GPUs"):
        sizing.apply(c)


def test_cpu_smoke_keeps_its_own_sizes(env: None) -> None:  # noqa: F811
    from tests.trainer.phases.test_launch import composed

    c = composed("b1_grpo", "profile=cpu-smoke")
    assert c.sizing.auto is False and c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2

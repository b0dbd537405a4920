"""The verl_stock row: VERL's own config accepts every override, and its reward is B1's schema reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import verl_stock
from shared.rewards import compute_schema_reward_single


def test_every_override_is_a_key_of_verls_own_ppo_trainer(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    ovr = verl_stock.overrides(tmp_path / "data", tmp_path / "pi1", tmp_path / "out", steps=6)
    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer", overrides=ovr)  # an unknown key (no "+") raises here
    arr = cfg.actor_rollout_ref
    assert cfg.data.train_batch_size == 64 and arr.rollout.n == 16 and arr.actor.ppo_mini_batch_size == 8
    assert cfg.data.max_response_length == 256 and cfg.trainer.total_training_steps == 6
    assert arr.rollout.tensor_model_parallel_size == 1 == cfg.trainer.n_gpus_per_node  # VERL's default is 2
    assert cfg.reward.custom_reward_function.path == str(Path(verl_stock.__file__).resolve())
    # VERL's defaults stay: no dynamic sampling, compiled vLLM, the actor recomputes the old log-probs
    assert cfg.algorithm.get("filter_groups") is None or not cfg.algorithm.filter_groups.enable
    assert arr.rollout.enforce_eager is False and arr.actor.use_kl_loss is False


def test_the_reward_is_b1s_schema_reward() -> None:
    gold = {"schema": {"columns": ["name", "food"]}}
    pred = '{"columns": ["name", "area"]}'
    out = verl_stock.compute_score("schema", pred, json.dumps(gold))
    want = compute_schema_reward_single(pred, gold["schema"])
    assert out == {"score": pytest.approx(want.reward), "valid_json": 1.0, "f1": pytest.approx(want.f1)}
    assert verl_stock.compute_score("schema", "not json", gold)["valid_json"] == 0.0
    with pytest.raises(ValueError, match="'schema' expected"):
        verl_stock.compute_score("schema", pred, json.dumps({"table": []}))

"""The VERL hook: the registered trainer's _validate ends VERL 0.9.1's own PPOTrainer.fit loop.

The loop under test is VERL's real ``fit``; only the expensive parts around it (rollout+update
step, weight sync, checkpoint writing, validation generation) are replaced by a scripted harness
whose validation scores plateau, so the stop is deterministic.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def c1_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trainer.phases.launch import CONFIG_DIR, REPO_ROOT

    out = tmp_path_factory.mktemp("es_out")
    env = {
        "TRAINER_DATA_DIR": str(out),
        "TRAINER_OUT_DIR": str(out),
        "TRAINER_REPO_ROOT": str(REPO_ROOT),
        "POLICY_MODEL_PATH": "/nonexistent",
        "TRAINER_REWARD_URL": "http://127.0.0.1:9",  # as the launcher sets it
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            # the harness scripts rollout and validation away: nothing asks the reward API, nothing waits for it
            overrides = ["profile=cpu-smoke", "trainer.logger=[console]", "reward_ready.wait=false"]
            cfg = compose("c1_grpo", overrides=overrides)
        OmegaConf.resolve(cfg)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return cfg


class _Batch:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.partition_id = "train"


def scripted_trainer(config: Any, scores: list[float], total_steps: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """PhaseTrainer with a scripted step/validation around VERL's real fit loop."""
    from verl.trainer.ppo.v1 import trainer_base

    from trainer.in_verl.phase_trainer import (
        PhaseTrainer,
        failure_policy_from_config,
        stopper_from_config,
    )
    from trainer.phase_rules.rollout_failures import FAILURE_FILE, RewardFailureLog

    t: Any = PhaseTrainer.__new__(PhaseTrainer)
    t.config = config
    t.early_stopper = stopper_from_config(config)
    t.failure_policy = failure_policy_from_config(config)
    t.failure_file = Path(config.trainer.default_local_dir) / FAILURE_FILE
    t.reward_failures = RewardFailureLog(None)
    t._failure_metrics = {}
    t.global_steps = 0
    t.steps_per_epoch = 1000
    t.total_training_steps = total_steps
    t._init_dump_executor()
    t.trained_steps = []
    t.train_end_called = False
    ckpt = Path(config.trainer.default_local_dir)
    script = iter(scores)

    def step(metrics: dict[str, Any], timing_raw: dict[str, Any]) -> _Batch:
        t.trained_steps.append(t.global_steps)
        return _Batch()

    def save() -> None:
        (ckpt / f"global_step_{t.global_steps}" / "actor").mkdir(parents=True, exist_ok=True)

    def on_train_end() -> None:
        t.train_end_called = True

    def scripted_validate(self: Any) -> dict[str, float]:
        return {"val-core/pipeline/reward/mean@1": next(script)}

    monkeypatch.setattr(trainer_base.PPOTrainer, "_validate", scripted_validate)
    tq: Any = trainer_base.tq  # type: ignore[attr-defined]
    monkeypatch.setattr(tq, "kv_clear", lambda **_kw: None)
    for name, fn in {
        "step": step,
        "_save_checkpoint": save,
        "on_step_end": lambda: None,
        "on_train_end": on_train_end,
        "_compute_metrics": lambda *a, **k: None,
        "_reissue_inflight_prompts": lambda *a, **k: 0,
        "_start_profiling": lambda: None,
        "_stop_profiling": lambda: None,
    }.items():
        setattr(t, name, fn)
    return t


def test_plateau_halts_verl_fit_loop(c1_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        c1_config,
        {"trainer": {"test_freq": 1, "save_freq": 1, "val_before_train": True}, "early_stopping": {"patience": 2}},
    )
    # step 0 baseline, then 1: gain, 2: gain, 3-4: plateau -> stop after step 4 of 10
    t = scripted_trainer(cfg, [0.10, 0.20, 0.30, 0.302, 0.299, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9], 10, monkeypatch)
    t.fit(agent_loop_manager=None)
    assert t.trained_steps == [1, 2, 3, 4]
    assert t.train_end_called
    st = t.early_stopper.state
    # step 3 (0.302) is no progress over 0.30 (min_delta), but it is the best checkpoint: kept, not pruned
    assert st.stopped and st.stop_step == 4 and st.best_step == 3
    ckpt = Path(cfg.trainer.default_local_dir)
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_3", "global_step_4"]


def test_no_plateau_runs_to_the_end(c1_config: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        c1_config,
        {
            "trainer": {"test_freq": 1, "save_freq": 1, "val_before_train": False, "default_local_dir": str(tmp_path)},
            "early_stopping": {"patience": 2},
        },
    )
    t = scripted_trainer(cfg, [0.1, 0.2, 0.3, 0.4, 0.5], 5, monkeypatch)
    t.fit(agent_loop_manager=None)
    assert t.trained_steps == [1, 2, 3, 4, 5]
    assert not t.early_stopper.state.stopped


def test_save_freq_must_match_test_freq(c1_config: Any) -> None:
    from omegaconf import OmegaConf

    from trainer.in_verl.phase_trainer import stopper_from_config

    cfg: Any = OmegaConf.merge(c1_config, {"trainer": {"test_freq": 5, "save_freq": 10}})
    with pytest.raises(ValueError, match=r"save_freq must equal trainer\.test_freq"):
        stopper_from_config(cfg)


def test_a_gain_below_min_delta_keeps_that_checkpoint(
    c1_config: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Step 2 scores highest but gains < min_delta over step 1; it is the one kept and exported."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        c1_config,
        {
            "trainer": {"test_freq": 1, "save_freq": 1, "val_before_train": False, "default_local_dir": str(tmp_path)},
            "early_stopping": {"patience": 2, "min_delta": 0.01},
        },
    )
    t = scripted_trainer(cfg, [0.30, 0.304, 0.29, 0.28, 0.5], 5, monkeypatch)
    t.fit(agent_loop_manager=None)
    st = t.early_stopper.state
    assert t.trained_steps == [1, 2, 3] and st.stopped and st.stop_step == 3
    assert st.best_step == 2 and st.best_score == pytest.approx(0.304)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_2", "global_step_3"]


class _Replicas:
    def update_weights(self, *_a: Any) -> None:
        return None


def resumed_trainer(cfg: Any, scores: list[float], monkeypatch: pytest.MonkeyPatch, step: int) -> Any:
    """The trainer as VERL's init() leaves it after _load_checkpoint resumed ``step``."""
    t = scripted_trainer(cfg, scores, 5, monkeypatch)
    t.global_steps = step
    t.checkpoint_manager = _Replicas()
    t.on_init_end()
    return t


def test_resume_does_not_revalidate_a_scored_step(
    c1_config: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from omegaconf import OmegaConf

    from trainer.phase_rules.early_stopping import EarlyStopper

    cfg = OmegaConf.merge(
        c1_config,
        {
            "trainer": {"test_freq": 1, "save_freq": 1, "val_before_train": True, "default_local_dir": str(tmp_path)},
            "early_stopping": {"patience": 2},
        },
    )
    first = scripted_trainer(cfg, [], 5, monkeypatch)
    first.early_stopper.update(1, {"val-core/pipeline/reward/mean@1": 0.5})
    first.early_stopper.update(2, {"val-core/pipeline/reward/mean@1": 0.5})  # 1 validation without progress
    # resumed at step 2: step 2 is not validated again; steps 3 and 4 are validated and improve
    t = resumed_trainer(cfg, [0.6, 0.7, 0.8], monkeypatch, step=2)
    assert cfg.trainer.val_before_train is False
    t.fit(agent_loop_manager=None)
    assert t.trained_steps == [3, 4, 5]
    assert [e.step for e in EarlyStopper(t.early_stopper.cfg, t.early_stopper.state_path).state.history] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert not t.early_stopper.state.stopped


def test_resume_validates_a_step_whose_validation_failed(
    c1_config: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        c1_config,
        {
            "trainer": {"test_freq": 1, "save_freq": 1, "val_before_train": False, "default_local_dir": str(tmp_path)},
            "early_stopping": {"patience": 2},
        },
    )
    first = scripted_trainer(cfg, [], 5, monkeypatch)
    first.early_stopper.update(1, {"val-core/pipeline/reward/mean@1": 0.5})
    # step 2 was trained and saved, its validation failed: the resumed run validates it first
    t = resumed_trainer(cfg, [0.55, 0.6, 0.7, 0.8], monkeypatch, step=2)
    assert cfg.trainer.val_before_train is True
    t.fit(agent_loop_manager=None)
    assert [e.step for e in t.early_stopper.state.history] == [1, 2, 3, 4, 5]


def test_the_replay_buffer_polls_at_the_configured_interval(c1_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """VERL's ReplayBuffer sleeps ``poll_interval`` (2.0 s) between looks at a step's groups; ours is
    ``replay_buffer.poll_s`` (0.1 s in grpo_base.yaml), set on the buffer VERL built."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from trainer.in_verl.phase_trainer import PhaseTrainer

    built = ReplayBuffer.__new__(ReplayBuffer)
    built.poll_interval = 2.0  # VERL's default, as its constructor sets it
    monkeypatch.setattr(PPOTrainerSync, "_build_replay_buffer", lambda self: built)
    t: Any = PhaseTrainer.__new__(PhaseTrainer)
    t.config = c1_config
    assert c1_config.replay_buffer.poll_s == pytest.approx(0.1)
    assert t._build_replay_buffer() is built and built.poll_interval == pytest.approx(0.1)
    # VERL's own wait uses that interval
    slept: list[float] = []
    monkeypatch.setattr("verl.trainer.ppo.v1.replay_buffer.time.sleep", slept.append)
    built.pending_keys = built.running_keys = built.finished_keys = built.failure_keys = {"train": []}
    built._wait_for_next_poll("train", last_debug_time=1e18)
    assert slept == [pytest.approx(0.1)]
    t.config = OmegaConf.merge(c1_config, {"replay_buffer": {"poll_s": 0}})
    with pytest.raises(ValueError, match=r"replay_buffer\.poll_s must be positive"):
        t._build_replay_buffer()

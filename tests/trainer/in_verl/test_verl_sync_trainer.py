"""The GRPO phases run VERL 0.9.1's own synchronous trainer, and failures stop them.

VERL's code runs for real here: ``PPOTrainer.__init__`` / ``_build_replay_buffer`` /
``_init_dataloader`` on the composed phase config, ``PPOTrainer._step_once`` with the real sync
``ReplayBuffer.sample``, and ``_val_metrics_update``. What is not run is Ray, vLLM and FSDP: the
TransferQueue tag store is :class:`FailedGroupTransferQueue`, which injects the fault (a prompt
group whose reward call failed, tagged exactly as ``AgentLoopWorkerTQ._run_prompt`` tags it).
The whole path with a real reward API that dies mid-run is ``make grpo-smoke`` (``--kill-reward-api``); in
``make test``, ``tests/reliability/test_trainer_failures.py::test_dead_reward_api`` kills a real reward API
between two steps' rewards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "trainer" / "data" / "sample"
GRPO_PHASES = ("b1_grpo", "b2_grpo", "c1_grpo", "c2_grpo")


def compose_phase(config_name: str, out: Path, model: str, overrides: tuple[str, ...] = ()) -> Any:
    """The phase config exactly as ``trainer run`` composes it (profile cpu-smoke), resolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from trainer.phases.launch import CONFIG_DIR

    env = {
        "TRAINER_DATA_DIR": str(out / "data"),
        "TRAINER_OUT_DIR": str(out),
        "TRAINER_REPO_ROOT": str(REPO),
        "POLICY_MODEL_PATH": model,
        "TRAINER_REWARD_URL": "http://127.0.0.1:9",  # as the launcher sets it
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name, overrides=["profile=cpu-smoke", "trainer.logger=[console]", *overrides])
        OmegaConf.resolve(cfg)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return cfg


@pytest.fixture(scope="module")
def model_dir() -> str:
    from services.executor_vllm.default_model import convert

    return str(convert())


@pytest.mark.parametrize("name", GRPO_PHASES)
def test_every_grpo_phase_runs_verl_mode_sync(name: str, tmp_path: Path) -> None:
    cfg = compose_phase(name, tmp_path, "/nonexistent")
    assert cfg.trainer.v1.trainer_mode == "sync"


def test_replay_buffer_and_gen_batch_size_are_plain_sync(
    tmp_path: Path, model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our trainer, built as the task runner builds it, has VERL's sync replay buffer and batch sizes."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from trainer.data.datasets import build_datasets
    from trainer.in_verl.phase_trainer import PhaseTrainer, install

    build_datasets(SAMPLE, tmp_path / "data", ["c1"])
    ours_cfg = compose_phase("c1_grpo", tmp_path, model_dir, ("data.train_batch_size=4",))
    plain_cfg = OmegaConf.merge(ours_cfg, {"trainer": {"v1": {"trainer_mode": "sync"}}})

    # install() patches VERL's registry for the process; the test process gets it back afterwards
    monkeypatch.setitem(trainer_base.TRAINER_REGISTRY, "sync", PPOTrainerSync)
    install(ours_cfg)  # what PhaseTaskRunner.run does before VERL's TaskRunnerV1.run
    ours = get_trainer_cls(ours_cfg.trainer.v1.trainer_mode)(config=ours_cfg)
    plain = PPOTrainerSync(config=plain_cfg)
    assert type(ours) is PhaseTrainer and isinstance(ours, PPOTrainerSync)
    assert ours.trainer_mode == plain.trainer_mode == "sync"
    assert type(ours.replay_buffer) is type(plain.replay_buffer) is ReplayBuffer
    assert ours.replay_buffer.gen_batch_size == plain.replay_buffer.gen_batch_size == 4
    for t in (ours, plain):
        t._init_tokenizer()
        t._init_dataloader()
    # _init_dataloader forces gen_batch_size=1 (one prompt per fetch) on every non-sync mode
    assert ours.config.data.get("gen_batch_size") == plain.config.data.get("gen_batch_size")
    assert ours.train_dataloader.batch_size == plain.train_dataloader.batch_size == 4


def test_install_refuses_a_mode_other_than_sync(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from trainer.in_verl.phase_trainer import install

    cfg = OmegaConf.merge(
        compose_phase("c1_grpo", tmp_path, "/nonexistent"), {"trainer": {"v1": {"trainer_mode": "sync_early_stop"}}}
    )
    with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode must be 'sync'.*sync_early_stop"):
        install(cfg)


# ---- failures ------------------------------------------------------------------------------------


class FailedGroupTransferQueue:
    """TransferQueue's tag store after one rollout step, with a failed reward call injected.

    Two prompt groups of ``n=2`` sessions. Group ``b``'s session 1 raised in ``compute_score``:
    ``_run_prompt`` tagged the group ``failure`` and the session left no trajectory.
    """

    def __init__(self, failed_sessions: int = 1) -> None:
        traj = {"status": "success", "global_steps": 1, "prompt_len": 3, "response_len": 2, "seq_len": 5}
        self.tags: dict[str, dict[str, Any]] = {
            "a": {"is_prompt": True, "status": "finished", "global_steps": 1},
            "b": {"is_prompt": True, "status": "failure" if failed_sessions else "finished", "global_steps": 1},
            "a_0_0": dict(traj),
            "a_1_0": dict(traj),
        }
        for s in range(2 - failed_sessions):
            self.tags[f"b_{s}_0"] = dict(traj)

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return {"train": dict(self.tags)}

    def kv_clear(self, partition_id: str, keys: list[str]) -> None:
        for k in keys:
            self.tags.pop(k, None)


class ReachedUpdate(Exception):
    """Raised where VERL's step would go on to balance, score and update the batch."""


@pytest.fixture
def phase_cfg(tmp_path: Path) -> Iterator[Any]:
    yield compose_phase("c1_grpo", tmp_path, "/nonexistent")


def trainer_for_step(cfg: Any, tq: FailedGroupTransferQueue, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Our trainer, built by VERL's PPOTrainer.__init__, at step 1 with the injected tag store."""
    from verl.trainer.ppo.v1 import replay_buffer

    from trainer.in_verl.phase_trainer import PhaseTrainer

    monkeypatch.setattr(replay_buffer, "tq", tq)
    monkeypatch.setattr(replay_buffer.ReplayBuffer, "_wait_for_next_poll", lambda *a: pytest.fail("batch incomplete"))
    t = PhaseTrainer(cfg)
    t.global_steps = 1
    t.curr_step_profile = False
    t.slept = 0

    class Replicas:
        def sleep_replicas(self) -> None:
            t.slept += 1

    class RewardLoop:
        reward_loop_worker_handles = ("remote reward workers",)

    t.checkpoint_manager = Replicas()
    t.reward_loop_manager = RewardLoop()

    def reached(*_a: Any, **_k: Any) -> Any:
        raise ReachedUpdate

    t._balance_batch = reached
    return t


def reward_failure(cfg: Any, url: str = "http://127.0.0.1:18499/reward/pipeline") -> None:
    """What trainer/in_verl/reward_fn.py appends when the reward client raises."""
    from trainer.in_verl.reward_batcher import RewardServiceError
    from trainer.phase_rules.rollout_failures import record_reward_failure

    path = cfg.reward.custom_reward_function.reward_kwargs.failure_log
    err = RewardServiceError(f"{url}: HTTP 503 after 4 attempts: executor_unavailable")
    record_reward_failure(path, "pipeline", "c1-x", err)


def test_a_failed_training_sample_stops_the_step_before_the_update(
    phase_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.phase_rules.rollout_failures import FAILURE_FILE, RolloutFailureError

    cfg = phase_cfg
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    t = trainer_for_step(cfg, FailedGroupTransferQueue(failed_sessions=1), monkeypatch)
    reward_failure(cfg)
    with pytest.raises(RolloutFailureError) as info:
        t._step_once({}, {}, sample_batch_size=2)  # VERL's step: sample -> on_sample_end -> ...
    msg = str(info.value)
    assert "training step 1: 1 of 4 samples failed" in msg
    assert "http://127.0.0.1:18499/reward/pipeline: HTTP 503" in msg
    assert t.slept == 1  # VERL's own on_sample_end ran first
    record = json.loads((Path(cfg.trainer.default_local_dir) / FAILURE_FILE).read_text())
    assert record["where"] == "training" and record["failed"] == 1 and record["expected"] == 4
    assert not list(Path(cfg.trainer.default_local_dir).glob("global_step_*"))


def test_a_bounded_failure_share_trains_on_and_counts(phase_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(phase_cfg, {"failures": {"max_share": 0.25}})
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    t = trainer_for_step(cfg, FailedGroupTransferQueue(failed_sessions=1), monkeypatch)
    reward_failure(cfg)
    with pytest.raises(ReachedUpdate):
        t._step_once({}, {}, sample_batch_size=2)
    metrics = t._consume_sync_metrics()
    assert metrics["training/rollout_failure/failed_samples"] == 1.0
    assert metrics["training/rollout_failure/share"] == 0.25


def test_no_failure_counts_zero(phase_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = phase_cfg
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    t = trainer_for_step(cfg, FailedGroupTransferQueue(failed_sessions=0), monkeypatch)
    with pytest.raises(ReachedUpdate):
        t._step_once({}, {}, sample_batch_size=2)
    assert t._consume_sync_metrics()["training/rollout_failure/failed_samples"] == 0.0


def test_every_group_failed_names_the_cause_beside_verls_error(phase_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """All sessions failed: VERL's sync sampler raises itself; our error adds the reward client's."""
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    cfg = phase_cfg
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 1, 2
    tq = FailedGroupTransferQueue(failed_sessions=2)
    del tq.tags["a"], tq.tags["a_0_0"], tq.tags["a_1_0"]
    t = trainer_for_step(cfg, tq, monkeypatch)
    reward_failure(cfg)
    with pytest.raises(RolloutFailureError, match=r"2 of 2 samples failed.*HTTP 503") as info:
        t._step_once({}, {}, sample_batch_size=1)
    assert "no materializable trajectories" in str(info.value.__cause__)


def val_inputs(scored: int, expected: int) -> tuple[list[str], list[str], dict[str, list[float]], list[int], Any]:
    """The lists VERL's _validate hands to _val_metrics_update: one entry per scored session."""
    uids = [f"u{i}" for i in range(expected)]
    return (
        ["pipeline"] * scored,
        uids[:scored],
        {"reward": [0.5] * scored, "f1": [1.0] * scored},
        [1] * scored,
        {("pipeline", u): 1 for u in uids},
    )


def test_validation_that_scored_fewer_samples_than_the_set_stops(phase_cfg: Any) -> None:
    from trainer.in_verl.phase_trainer import PhaseTrainer
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    t = PhaseTrainer(phase_cfg)
    t.global_steps = 3
    reward_failure(phase_cfg)
    ds, uids, extra, turns, expected = val_inputs(scored=5, expected=6)
    with pytest.raises(RolloutFailureError, match=r"validation at step 3: 1 of 6 samples failed.*HTTP 503"):
        t._val_metrics_update(ds, uids, extra, turns, expected_acc_counts=expected)
    assert t.early_stopper.state.history == []  # the subset score never reached early stopping

    ds, uids, extra, turns, expected = val_inputs(scored=6, expected=6)
    metrics = t._val_metrics_update(ds, uids, extra, turns, expected_acc_counts=expected)
    assert metrics["val-core/pipeline/reward/mean@1"] == 0.5
    assert metrics["validation/rollout_failure/failed_samples"] == 0.0


# ---- dynamic sampling (algorithm.filter_groups) with the failure policy ----------------------------


class DapoTransferQueue(FailedGroupTransferQueue):
    """The tag store with rewards: VERL's DAPO filter reads each trajectory's ``rm_scores`` (metric
    ``reward``), and our valid-output monitor its ``extra_fields``. ``groups``: uid -> rewards of its
    sessions (a failed group: tagged ``failure``, one session missing). ``generate`` is what the
    rollout would add for a refill of k prompts."""

    def __init__(self, groups: dict[str, list[float]], failed: tuple[str, ...] = ()) -> None:
        super().__init__(failed_sessions=0)
        self.tags.clear()
        self.rewards: dict[str, float] = {}
        self.refills: list[int] = []
        self.next_groups: list[list[float]] = []
        for uid, rewards in groups.items():
            self.add(uid, rewards, failed=uid in failed)

    def add(self, uid: str, rewards: list[float], failed: bool = False) -> None:
        traj = {"status": "success", "global_steps": 1, "prompt_len": 3, "response_len": 2, "seq_len": 5}
        self.tags[uid] = {"is_prompt": True, "status": "failure" if failed else "finished", "global_steps": 1}
        for s, r in enumerate(rewards[:-1] if failed else rewards):
            self.tags[f"{uid}_{s}_0"] = dict(traj)
            self.rewards[f"{uid}_{s}_0"] = r

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> dict[str, list[Any]]:
        import torch

        out: dict[str, list[Any]] = {}
        if "rm_scores" in select_fields:
            out["rm_scores"] = [torch.tensor([0.0, self.rewards[k]]) for k in keys]
        if "extra_fields" in select_fields:
            out["extra_fields"] = [{"reward_extra_info": {"valid_json": self.rewards[k] > -1}} for k in keys]
        return out

    def refill(self, k: int) -> int:
        self.refills.append(k)
        for i in range(k):
            self.add(f"r{len(self.refills)}x{i}", self.next_groups.pop(0) if self.next_groups else [1.0, 1.0])
        return k


DAPO = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward")


def dapo_trainer(
    tmp_path: Path, tq: DapoTransferQueue, monkeypatch: pytest.MonkeyPatch, *overrides: str
) -> tuple[Any, list[Any]]:
    from verl.trainer.ppo.v1 import trainer_base

    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", (*DAPO, *overrides))
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    # VERL's own refill would fetch prompts and start the rollout; here the tag store "generates" them
    monkeypatch.setattr(trainer_base.PPOTrainer, "_add_prompts_to_generate", tq.refill)
    t = trainer_for_step(cfg, tq, monkeypatch)
    t._step_prompts = 2  # what prepare_step records: the first batch of the step
    batches: list[Any] = []

    def reached(batch: Any, *_a: Any, **_k: Any) -> Any:
        batches.append(batch)
        raise ReachedUpdate

    t._balance_batch = reached
    return t, batches


def test_dynamic_sampling_is_on_in_verls_sync_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t, _ = dapo_trainer(tmp_path, DapoTransferQueue({"a": [0.2, 0.8]}), monkeypatch)
    assert t.replay_buffer.filter_groups_metric == "reward" and t.replay_buffer.gen_batch_size == 1
    assert t.dynamic_sampling.enabled and t.dynamic_sampling.max_prompts is None  # VERL's default 0: no bound


def test_with_dynamic_sampling_a_failed_sample_still_stops_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    # a differs, c is all-equal (evicted), b's reward call failed: the failed group is not evicted
    tq = DapoTransferQueue({"a": [0.2, 0.8], "b": [0.5, 0.5], "c": [1.0, 1.0]}, failed=("b",))
    t, _ = dapo_trainer(tmp_path, tq, monkeypatch)
    reward_failure(t.config)
    metrics: dict[str, Any] = {}
    with pytest.raises(RolloutFailureError, match=r"training step 1: 1 of 4 samples failed.*HTTP 503"):
        t._step_once(metrics, {}, sample_batch_size=2)
    assert metrics["training/filter_groups/evicted_samples"] == 1  # c, evicted by VERL's DAPO filter
    assert tq.refills == []  # a and b were enough


def test_with_dynamic_sampling_a_bounded_share_trains_on_counts_and_refills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tq = DapoTransferQueue({"a": [0.2, 0.8], "b": [0.5, 0.5], "c": [1.0, 1.0]}, failed=("b",))
    tq.next_groups = [[-1.0, 0.4], [1.0, 1.0]]
    t, batches = dapo_trainer(tmp_path, tq, monkeypatch, "failures.max_share=0.25", "data.train_batch_size=3")
    t.config.data.train_batch_size = 3
    t._step_prompts = 3
    metrics: dict[str, Any] = {}
    with pytest.raises(ReachedUpdate):
        t._step_once(metrics, {}, sample_batch_size=3)
    # c evicted -> 2 refills (VERL's 2k); of those one is all-equal and evicted too
    assert tq.refills == [2] and metrics["training/filter_groups/evicted_samples"] == 2
    counted = t._consume_sync_metrics()
    assert counted["training/rollout_failure/failed_samples"] == 1.0
    assert counted["training/rollout_failure/share"] == pytest.approx(1 / 6)
    assert counted["training/dynamic_sampling/generated_prompts"] == 5.0
    assert sorted({k.split("_")[0] for k in batches[0].keys}) == ["a", "b", "r1x0"]
    # the valid-output monitor reads the sampled trajectories: 1 of 5 (b lost one session) is invalid
    from trainer.in_verl.phase_trainer import PhaseTrainer

    assert PhaseTrainer._valid_output_metrics(t, batches[0]) == {
        "training/valid_output/share": pytest.approx(4 / 5), "training/valid_output/samples": 5.0,
    }  # fmt: skip


def test_dynamic_sampling_past_its_budget_stops_the_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.phase_rules.monitors import DynamicSamplingExhaustedError
    from trainer.phase_rules.rollout_failures import FAILURE_FILE

    tq = DapoTransferQueue({"a": [1.0, 1.0], "c": [0.0, 0.0]})  # nothing differs, and nothing will
    t, _ = dapo_trainer(tmp_path, tq, monkeypatch, "algorithm.filter_groups.max_num_gen_batches=3")
    assert t.dynamic_sampling.max_prompts == 6
    with pytest.raises(DynamicSamplingExhaustedError, match=r"generated 6 prompts and needs \d+ more.*no headroom"):
        t._step_once({}, {}, sample_batch_size=2)
    assert sum(tq.refills) == 4  # 2 + 4 = 6 prompts, then the budget ends the step instead of sampling for ever
    record = json.loads((Path(t.config.trainer.default_local_dir) / FAILURE_FILE).read_text())
    assert record["cause"] == "dynamic_sampling_exhausted" and "max_num_gen_batches=3" in record["message"]


def test_prefetch_sends_the_expected_shortfall_with_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # step 1: a is informative, c all-equal (evicted, refilled twice); the prefetch learns a share of 3/4
    tq = DapoTransferQueue({"a": [0.2, 0.8], "c": [1.0, 1.0]})
    tq.next_groups = [[0.1, 0.9], [0.3, 0.4]]
    t, _ = dapo_trainer(tmp_path, tq, monkeypatch, "replay_buffer.prefetch_max_factor=2.0")
    assert t.prefetch.enabled and t.prefetch.first_dispatch(2) == 2  # nothing observed yet: one batch
    with pytest.raises(ReachedUpdate):  # 2 first + 2 refills: 4 prompts, 1 evicted
        t._step_once({}, {}, sample_batch_size=2)
    assert t.prefetch.informative_share == pytest.approx(3 / 4)
    # step 2: the first batch of 64 carries ceil(64 / 0.75) - 64 = 22 more prompts, counted in the step
    sent: list[int] = []
    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_base.PPOTrainer._add_batch_to_generate", lambda self: None)
    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_base.PPOTrainer._add_prompts_to_generate",
                        lambda self, k: sent.append(k) or k)  # fmt: skip
    t.config.data.train_batch_size = 64
    out = t.prepare_step()
    assert sent == [22] and t._step_prompts == 86
    assert out["training/dynamic_sampling/prefetched_prompts"] == 22.0


def test_prefetch_is_off_at_factor_one_and_never_passes_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.in_verl.prefetch import GroupPrefetch
    from trainer.phase_rules.monitors import DynamicSamplingBudget

    t, _ = dapo_trainer(tmp_path, DapoTransferQueue({"a": [0.2, 0.8]}), monkeypatch)
    assert not t.prefetch.enabled  # grpo_base's default: VERL's own rounds
    t.prefetch = GroupPrefetch(max_factor=4.0, informative_share=0.1)
    t.dynamic_sampling = DynamicSamplingBudget(enabled=True, train_batch_size=64, max_num_gen_batches=2)
    sent: list[int] = []
    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_base.PPOTrainer._add_batch_to_generate", lambda self: None)
    monkeypatch.setattr("verl.trainer.ppo.v1.trainer_base.PPOTrainer._add_prompts_to_generate",
                        lambda self, k: sent.append(k) or k)  # fmt: skip
    t.config.data.train_batch_size = 64
    t.prepare_step()
    assert sent == [64] and t._step_prompts == 128  # 4 x 64 capped at the budget of 2 x 64
    with pytest.raises(ValueError, match=r"prefetch_max_factor must be at least 1\.0"):
        GroupPrefetch(max_factor=0.5)

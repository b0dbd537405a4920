"""Mask mode (trainer/phase_rules/failure_mask.py) through VERL's real advantage computation on CPU.

VERL's code runs for real: ``compute_advantage_for_multi_trajectories`` / ``compute_advantage`` with our
registered ``grpo_masked`` estimator, and ``PPOTrainer._compute_advantage`` of :class:`PhaseTrainer` on the
composed C1 config. What is faked is the TransferQueue (:class:`InjectedFailuresTransferQueue`): it holds one
step's trajectories as VERL keeps them (nested per-sample masks and scores, the reward parts under
``extra_fields``) and injects the fault: samples whose executor truncated the table, as the reward function
marks them in mask mode.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase, reward_failure

pytestmark = pytest.mark.verl
# every profile's default (the cpu-smoke profile the tests compose with included), stated
MASK = ("failures.mode=mask",)


def grpo_reference(rewards: list[float], uids: list[str], lens: list[int], estimator: str = "grpo") -> Any:
    """VERL's own advantages of a batch, padded ``(bs, L)``: its real ``compute_advantage_for_multi_trajectories``."""
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    import trainer.in_verl.advantages  # noqa: F401  (registers grpo_masked)

    width = max(lens)
    mask = torch.zeros(len(lens), width, dtype=torch.int64)
    scores = torch.zeros(len(lens), width)
    for i, (n, r) in enumerate(zip(lens, rewards, strict=True)):
        mask[i, :n] = 1
        scores[i, max(n - 1, 0)] = r
    return (
        mask,
        scores,
        compute_advantage_for_multi_trajectories(
            DataProto.from_dict(
                tensors={"response_mask": mask, "token_level_rewards": scores},
                non_tensors={"uid": np.array(uids, dtype=object)},
            ),
            batch_keys=[f"{u}_{i}_0" for i, u in enumerate(uids)],
            adv_estimator=estimator,
            num_repeat=1,
            norm_adv_by_std_in_grpo=True,
            config={"norm_adv_by_std_in_grpo": True},
        ).batch["advantages"],
    )


def test_grpo_masked_equals_verls_grpo_when_nothing_is_masked() -> None:
    rewards, uids, lens = [1.0, 0.0, 0.5, 0.2, 0.9, 0.9], ["a", "a", "a", "b", "b", "c"], [2, 3, 2, 4, 1, 2]
    _, _, ours = grpo_reference(rewards, uids, lens, "grpo_masked")
    _, _, verl = grpo_reference(rewards, uids, lens, "grpo")
    # c is a group of one: VERL gives it its raw reward (mean 0, std 1); it is the one row that differs
    assert ours[:5].tolist() == verl[:5].tolist()
    assert verl[5].abs().sum() > 0 and ours[5].abs().sum() == 0


def test_a_masked_row_is_out_of_its_group_and_the_valid_ones_keep_their_advantages() -> None:
    """The same batch with and without the failed samples gives the same advantages for the valid ones."""
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    rewards, uids, lens = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.3], ["a"] * 4 + ["b"] * 3, [2, 3, 2, 3, 4, 1, 2]
    failed = {1, 6}  # a's second sample and b's third: scored 0 by the reward function, masked
    mask, scores, _ = grpo_reference(rewards, uids, lens)
    mask[list(failed)] = 0  # what PhaseTrainer does to a masked sample before the advantage
    tensors = {"response_mask": mask, "token_level_rewards": scores}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(uids, dtype=object)})
    keys = [f"{u}_{i}_0" for i, u in enumerate(uids)]
    ours = compute_advantage_for_multi_trajectories(data, keys, "grpo_masked", config={}).batch["advantages"]
    keep = [i for i in range(len(uids)) if i not in failed]
    _, _, without = grpo_reference([rewards[i] for i in keep], [uids[i] for i in keep], [lens[i] for i in keep])
    width = without.shape[1]
    assert torch.equal(ours[keep][:, :width], without) and ours[keep][:, width:].abs().sum() == 0
    assert ours[list(failed)].abs().sum() == 0


# ---- the trainer: masks zeroed in the TransferQueue, VERL's _compute_advantage on top -------------------


class InjectedFailuresTransferQueue:
    """TransferQueue after one rollout step, with executor truncations injected into the reward parts.

    Each trajectory holds what ``AgentLoopWorkerTQ`` puts (``response_mask`` and ``loss_mask`` nested per
    sample, ``rm_scores`` with the reward on the last response token, ``uid``, the reward function's parts under
    ``extra_fields.reward_extra_info``); a truncated sample carries what the reward function returns for it in
    mask mode (score 0, ``masked`` 1, ``executor_truncated`` 1)."""

    def __init__(
        self,
        groups: dict[str, list[float]],
        truncated: set[str],
        seed: int = 0,
        parts: dict[str, dict[str, float]] | None = None,
    ) -> None:
        import torch

        from trainer.in_verl.reward_batcher import masked_score

        rng = random.Random(seed)
        self.rows: dict[str, dict[str, Any]] = {}
        self.puts: list[dict[str, Any]] = []
        for uid, rewards in groups.items():
            for s, r in enumerate(rewards):
                key, n = f"{uid}_{s}_0", rng.randint(1, 6)
                info = masked_score("pipeline", "executor_truncated") if key in truncated else {"masked": 0.0}
                reward = info.get("score", r) if key in truncated else r
                if parts is not None and key in parts:  # what the reward function really returned for it
                    info, reward = parts[key], parts[key]["score"]
                self.rows[key] = {
                    "uid": uid,
                    "response_mask": torch.ones(n, dtype=torch.int64),
                    "loss_mask": torch.ones(n, dtype=torch.int64),
                    "rm_scores": torch.cat([torch.zeros(n - 1), torch.tensor([float(reward)])]),
                    "extra_fields": {"reward_extra_info": {**info, "score": reward}},
                }

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str] | None = None) -> Any:
        import torch
        from tensordict import TensorDict
        from tensordict.tensorclass import NonTensorStack

        out: dict[str, Any] = {}
        for name in select_fields or ["uid", "response_mask", "loss_mask", "rm_scores", "extra_fields"]:
            values = [self.rows[k].get(name) for k in keys]
            if any(v is None for v in values):
                continue  # a field VERL did not put (old_log_probs, ref_log_prob, values ...)
            if isinstance(values[0], torch.Tensor):
                out[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                out[name] = NonTensorStack(*values)
        return TensorDict(out, batch_size=[len(keys)])

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> Any:
        names = list(fields.keys())
        self.puts.append({name: fields[name] for name in names})
        for name in names:
            for key, value in zip(keys, fields[name].unbind(), strict=True):
                self.rows[key][name] = value
        return None


def trainer_with(tq: InjectedFailuresTransferQueue, cfg: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from verl.trainer.ppo.v1 import trainer_base

    from trainer.in_verl.phase_trainer import PhaseTrainer

    monkeypatch.setattr(trainer_base, "tq", tq)
    t = PhaseTrainer(cfg)
    t.global_steps = 1
    return t


def batch_of(tq: InjectedFailuresTransferQueue) -> Any:
    from transfer_queue import KVBatchMeta

    keys = list(tq.rows)
    return KVBatchMeta(partition_id="train", keys=keys, tags=[{"status": "success"} for _ in keys])


def test_phase_trainer_masks_truncated_samples_and_verl_trains_only_on_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor that truncates ~30% of the answers: the truncated samples get zero masks and advantage 0,
    the valid samples get exactly VERL's GRPO advantages computed without them, a group left with one valid
    sample is dropped, and the step's metrics count them by cause."""
    import torch

    groups = {g: [round(random.Random(g).uniform(-1, 1), 3) for _ in range(4)] for g in "abcdefgh"}
    keys = [f"{g}_{s}_0" for g in groups for s in range(4)]
    # 9 truncations spread over a to g (at most two a group), and h keeps one valid sample of four
    truncated = {"a_1_0", "b_0_0", "b_3_0", "c_2_0", "d_1_0", "e_0_0", "f_3_0", "g_1_0", "g_2_0"}
    truncated |= {"h_0_0", "h_1_0", "h_2_0"}
    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", (*MASK, "failures.max_share=0.5"))
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 8, 4
    tq = InjectedFailuresTransferQueue(groups, truncated)
    t = trainer_with(tq, cfg, monkeypatch)
    metrics: dict[str, Any] = {}
    t._compute_advantage(batch_of(tq), metrics)

    adv = {k: float(tq.rows[k]["advantages"].sum()) for k in keys}
    no_grad = {k for k in keys if int(tq.rows[k]["response_mask"].sum()) == 0}
    assert no_grad == truncated | {"h_3_0"} and all(int(tq.rows[k]["loss_mask"].sum()) == 0 for k in no_grad)
    assert all(adv[k] == 0.0 for k in no_grad)
    valid = [k for k in keys if k not in no_grad]
    lens = [int(tq.rows[k]["response_mask"].numel()) for k in valid]
    _, _, want = grpo_reference([groups[k[0]][int(k[2])] for k in valid], [k[0] for k in valid], lens)
    for i, k in enumerate(valid):
        assert torch.equal(tq.rows[k]["advantages"], want[i, : lens[i]]), k
    assert metrics["training/masked/executor_truncated"] == 12.0 and metrics["training/masked/share"] == 12 / 32
    assert metrics["training/masked/dropped_groups"] == 1.0 and metrics["training/masked/no_gradient"] == 13.0
    counted = t._consume_sync_metrics()
    assert counted["training/rollout_failure/failed_samples"] == 12.0


def test_masked_samples_beyond_max_share_stop_the_step_with_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    groups = {"a": [0.1, 0.5, 0.9, 0.2], "b": [0.3, 0.3, 0.8, 0.0]}
    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", MASK)  # max_share 0.1 (the phase configs' default)
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 4
    tq = InjectedFailuresTransferQueue(groups, {"a_0_0", "b_1_0"})
    t = trainer_with(tq, cfg, monkeypatch)
    stopped = r"2 of 8 samples failed \(2 of them masked\).*executor_truncated"
    with pytest.raises(RolloutFailureError, match=stopped) as e:
        t._compute_advantage(batch_of(tq), {})
    # the executor caused it, so the stop names it: here the reward API at the composed URL does not answer /info
    assert "executor: the one behind the reward API at http://127.0.0.1:9 (its /info did not say" in str(e.value)
    assert not tq.puts  # nothing reached VERL's advantage


def test_penalize_mode_leaves_the_batch_to_verl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", ("failures.mode=penalize",))
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 1, 4
    assert cfg.reward.custom_reward_function.reward_kwargs.failure_mode == "penalize"
    tq = InjectedFailuresTransferQueue({"a": [0.1, 0.5, 0.9, 0.2]}, set())
    t = trainer_with(tq, cfg, monkeypatch)
    metrics: dict[str, Any] = {}
    t._compute_advantage(batch_of(tq), metrics)
    assert not any(k.startswith("training/masked") for k in metrics)
    assert [set(p) for p in tq.puts] == [{"advantages", "returns"}]  # only VERL's own write


def test_validation_leaves_masked_samples_out_of_the_score(tmp_path: Path) -> None:
    from trainer.in_verl.phase_trainer import PhaseTrainer
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", (*MASK, "failures.max_share=0.3"))
    t = PhaseTrainer(cfg)
    t.global_steps = 2
    uids = [f"u{i}" for i in range(10)]
    masked = [0.0] * 8 + [1.0, 1.0]
    infos = {
        "reward": [0.5] * 8 + [0.0, 0.0],
        "masked": masked,
        "executor_truncated": [0.0] * 8 + [1.0, 0.0],
        "reward_call_failed": [0.0] * 9 + [1.0],
    }
    expected = {("pipeline", u): 1 for u in uids}
    metrics = t._val_metrics_update(["pipeline"] * 10, uids, infos, [1] * 10, expected_acc_counts=expected)
    assert metrics["val-core/pipeline/reward/mean@1"] == 0.5  # not 0.4: the masked two are out
    assert metrics["validation/masked/executor_truncated"] == metrics["validation/masked/reward_call_failed"] == 1.0
    assert metrics["validation/rollout_failure/failed_samples"] == 2.0
    reward_failure(cfg)
    infos["masked"] = [0.0] * 6 + [1.0] * 4
    infos["reward_call_failed"] = [0.0] * 6 + [1.0] * 4
    infos["executor_truncated"] = [0.0] * 10
    with pytest.raises(RolloutFailureError, match=r"validation at step 2: 4 of 10 .*reward_call_failed \(4 samples\)"):
        t._val_metrics_update(["pipeline"] * 10, uids, infos, [1] * 10, expected_acc_counts=expected)
    assert t.early_stopper.state.history == []


def test_a_step_left_without_any_gradient_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group keeps one valid sample: under max_share, yet nothing would be trained on (and VERL's
    token-mean loss would divide by zero tokens). The phase stops and says so."""
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", (*MASK, "failures.max_share=0.6"))
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    tq = InjectedFailuresTransferQueue({"a": [0.1, 0.5], "b": [0.3, 0.8]}, {"a_0_0", "b_1_0"})
    t = trainer_with(tq, cfg, monkeypatch)
    with pytest.raises(RolloutFailureError, match=r"training step 1: no sample has a gradient.*executor_truncated"):
        t._compute_advantage(batch_of(tq), {})
    assert not tq.puts

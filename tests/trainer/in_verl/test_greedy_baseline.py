"""The self-critical advantage (``algorithm.adv_estimator: greedy_baseline``): a sample's reward minus its prompt's
greedy reward, through VERL's real advantage computation and :class:`PhaseTrainer` on the composed B1 config.

Faked: the TransferQueue (``InjectedFailuresTransferQueue`` holding one step's trajectories, now with the prompt
fields the agent loop puts) and the rollout client (``ScriptedGreedyRollout``: it answers each prompt with a
scripted text, as vLLM at temperature 0 would with one answer). Real: VERL's ``_compute_advantage`` and
``compute_advantage_for_multi_trajectories``, our estimator, and the reward of each greedy answer through the
phase's reward function and a real reward API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.trainer.in_verl.test_mask_mode import InjectedFailuresTransferQueue, batch_of, grpo_reference, trainer_with
from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase

pytestmark = pytest.mark.verl

GOLD = {"columns": [{"name": "name", "type": "string"}, {"name": "age", "type": "integer"}]}


def test_the_advantage_is_the_reward_minus_the_greedy_reward() -> None:
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from trainer.in_verl.advantages import GREEDY_BASELINE, greedy_baselines

    rewards, uids, lens = [1.0, 0.2, 0.5, 0.9, 0.1, 0.3, 0.4], ["a"] * 3 + ["b"] * 2 + ["c"] * 2, [2, 3, 2, 1, 4, 2, 2]
    mask, scores, _ = grpo_reference(rewards, uids, lens)
    mask[2] = 0  # a masked sample: out
    data = DataProto.from_dict(
        {"response_mask": mask, "token_level_rewards": scores}, non_tensors={"uid": np.array(uids, dtype=object)}
    )
    keys = [f"{u}_{i}_0" for i, u in enumerate(uids)]
    raw = {"norm_adv_by_std_in_grpo": False}  # Dr. GRPO's setting, the gpu profile's
    with greedy_baselines({"a": 0.5, "b": 0.9, "c": None}):  # c's greedy answer was masked: no baseline
        adv = compute_advantage_for_multi_trajectories(data, keys, GREEDY_BASELINE, config=raw).batch["advantages"]
    per_row = adv.sum(-1) / mask.sum(-1).clamp(min=1)
    assert per_row.tolist() == pytest.approx([0.5, -0.3, 0.0, 0.0, -0.8, 0.0, 0.0])
    assert torch.equal(adv != 0, (adv != 0) & (mask == 1))  # only response tokens carry it
    # only samples that beat the greedy answer are pushed up: a's 1.0 (0.5 above), not b's 0.9 (= greedy)
    with greedy_baselines({"a": 0.5, "b": 0.9}):
        scaled = compute_advantage_for_multi_trajectories(
            data, keys, GREEDY_BASELINE, config={"norm_adv_by_std_in_grpo": True}
        ).batch["advantages"]
    a_std = float(torch.tensor([1.0, 0.2]).std())
    assert float(scaled[0].sum() / 2) == pytest.approx(0.5 / (a_std + 1e-6), rel=1e-5)
    with pytest.raises(RuntimeError, match="needs the greedy rewards PhaseTrainer computes"):
        compute_advantage_for_multi_trajectories(data, keys, GREEDY_BASELINE, config=raw)


class ScriptedGreedyRollout:
    """VERL's rollout client for the greedy answers: prompt ids → the scripted text's token ids (or an error)."""

    def __init__(self, tokenizer: Any, answers: dict[int, str | Exception]) -> None:
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        self.calls.append((request_id, sampling_params))
        answer = self.answers[prompt_ids[0]]
        if isinstance(answer, Exception):
            raise answer

        class Out:
            token_ids = self.tokenizer.encode(answer)

        return Out()


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.service
def test_phase_trainer_scores_each_prompts_greedy_answer_and_verl_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B1 with greedy_baseline: before the replicas sleep, each prompt's greedy answer is generated once
    (temperature 0) and scored by the phase's reward function through a real reward API; VERL's advantage is
    then each sample's reward minus that. A prompt whose greedy generation failed has no baseline (advantage 0)."""
    import torch

    from tests.helpers.servers import RewardApiServer

    groups = {"a": [1.0, 0.2, 0.6], "b": [0.3, 0.9, 0.1], "c": [0.5, 0.5, 0.4]}
    partial = json.dumps({"columns": [{"name": "name", "type": "string"}]})  # half the gold schema
    overrides = (
        "failures.mode=mask", "algorithm.adv_estimator=greedy_baseline", "algorithm.norm_adv_by_std_in_grpo=false"
    )  # fmt: skip
    cfg = compose_phase("b1_grpo", tmp_path, "/nonexistent", overrides)
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 3, 3
    tq = InjectedFailuresTransferQueue(groups, set())
    for key, row in tq.rows.items():  # what the agent loop puts beside each trajectory
        uid = key.split("_")[0]
        truth = {"ground_truth": json.dumps({"schema": GOLD})}
        row.update(prompts=torch.tensor([ord(uid), 5, 6]), data_source="schema:people", reward_model=truth,
                   extra_info={"id": f"people-{uid}"})  # fmt: skip
    with RewardApiServer() as api:
        cfg.reward.custom_reward_function.reward_kwargs.url = api.url
        t = trainer_with(tq, cfg, monkeypatch)
        rollout = ScriptedGreedyRollout(FakeTokenizer(), {ord("a"): json.dumps(GOLD), ord("b"): partial,
                                                          ord("c"): ConnectionError("replica gone")})  # fmt: skip
        monkeypatch.setattr(t, "get_llm_client", lambda: rollout)
        t.tokenizer = FakeTokenizer()

        class Replicas:
            def sleep_replicas(self) -> None:
                t.slept = len(rollout.calls)  # the greedy answers came before the replicas slept

        t.checkpoint_manager, t.curr_step_profile = Replicas(), False
        t._sampled = batch_of(tq)
        t.on_sample_end()
        t._compute_advantage(batch_of(tq), {})
    assert t.slept == 3 and all(c[1]["temperature"] == 0.0 for c in rollout.calls)
    greedy_a = 1.0  # the gold schema scores 1; b's half schema less; c has none
    metrics = t._consume_sync_metrics()
    assert metrics["training/greedy_baseline/errors"] == 1.0 and metrics["training/greedy_baseline/prompts"] == 3.0
    b_greedy = metrics["training/greedy_baseline/reward_mean"] * 2 - greedy_a
    assert 0 < b_greedy < 1
    for uid, rewards in groups.items():
        base = {"a": greedy_a, "b": b_greedy}.get(uid)
        for s, r in enumerate(rewards):
            got = tq.rows[f"{uid}_{s}_0"]["advantages"]
            want = 0.0 if base is None else r - base
            assert got.tolist() == pytest.approx([want] * got.numel(), abs=1e-5), (uid, s)

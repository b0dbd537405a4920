"""Trainer failures: what the GRPO phases train on when the executor behind the pipeline reward fails, or the
reward API itself dies.

A real reward_api in front of a fault-injecting executor (``FaultyExecutor``), the trainer's own reward
function (``trainer/in_verl/reward_fn.py``, mask mode) and VERL's real advantage computation with the phases'
estimator ``grpo_masked``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from shared import GoldenExample, canonical_schema_json, gold_ndjson
from tests.helpers.faulty_executor import FaultyExecutor
from tests.helpers.servers import RewardApiServer
from tests.reliability.test_executor_faults import _env

pytestmark = [pytest.mark.service, pytest.mark.verl]


def schema_variants(ex: GoldenExample) -> list[str]:
    """Four valid schemas for one document (each its own Stage-2 prompt, so each its own executor call)."""
    gold = ex.schema_dict()
    cols = gold["columns"]
    extra = {**gold, "columns": [*cols, {"name": "notes", "type": "string"}]}
    fewer = {**gold, "columns": cols[:-1] or cols}
    other = {**gold, "columns": [*reversed(cols), {"name": "source", "type": "string"}]}
    return [canonical_schema_json(s) for s in (gold, extra, fewer, other)]


async def score_all(samples: list[tuple[str, str, str]], **reward_kwargs: Any) -> list[dict[str, float]]:
    """Every sample through the trainer's reward function at once (its batcher coalesces them); ``reward_kwargs``
    as VERL passes a phase's ``reward_kwargs`` (default: batches of 8, the URL from ``TRAINER_REWARD_URL``)."""
    from trainer.in_verl.reward_batcher import batchers_of_running_loop
    from trainer.in_verl.reward_fn import compute_score

    kwargs = reward_kwargs or {"max_batch": 8}
    try:
        return list(
            await asyncio.gather(
                *(compute_score("pipeline", pred, gt, {"id": key}, **kwargs) for key, pred, gt in samples)
            )
        )
    finally:
        for b in batchers_of_running_loop():
            await b.aclose()


def test_mask_truncated(examples: list[GoldenExample], record_property: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor that cuts 30% of its answers at max_tokens: the cut samples get no gradient, and the valid
    samples' advantages are exactly VERL's GRPO advantages computed without them."""
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    import trainer.in_verl.advantages  # noqa: F401  (registers grpo_masked)
    from trainer.phase_rules.failure_mask import plan_training_mask

    docs = [ex for ex in examples if len(ex.schema_dict()["columns"]) >= 2][:12]
    record_property("tried", f"{len(docs)} groups x 4 samples through reward_fn (mask mode); the executor cuts 30%")
    record_property("expected", "cut samples masked, no gradient; valid advantages == VERL's GRPO without them")
    samples = [
        (
            f"g{g}_{s}_0",
            pred,
            json.dumps({"text": ex.text, "schema": ex.schema_dict(), "table": ex.table_dict()}),
        )
        for g, ex in enumerate(docs)
        for s, pred in enumerate(schema_variants(ex))
    ]
    with (
        FaultyExecutor(content=gold_ndjson(docs[0].table_dict()), length_share=0.3) as fx,
        RewardApiServer(_env(fx.url)) as api,
    ):
        monkeypatch.setenv("TRAINER_REWARD_URL", api.url)
        parts = asyncio.run(score_all(samples))
        calls, cut = fx.calls, fx.length_answers
    keys = [k for k, *_ in samples]
    masked = [i for i, p in enumerate(parts) if p["masked"] == 1.0]
    assert calls == len(samples) and cut == int(len(samples) * 0.3)  # one call a sample, 30% of them cut
    assert len(masked) == cut and all(parts[i]["executor_truncated"] == 1.0 for i in masked)
    assert all(parts[i]["score"] == 0.0 for i in masked)

    plan = plan_training_mask(keys, parts)
    uids = np.array([k.split("_")[0] for k in keys], dtype=object)
    rewards = torch.tensor([p["score"] for p in parts])
    width = 4
    mask = torch.ones(len(keys), width, dtype=torch.int64)
    mask[list(plan.no_gradient)] = 0  # what PhaseTrainer writes to the TransferQueue
    scores = torch.zeros(len(keys), width)
    scores[:, -1] = rewards
    data = DataProto.from_dict({"response_mask": mask, "token_level_rewards": scores}, non_tensors={"uid": uids})
    ours = compute_advantage_for_multi_trajectories(data, keys, "grpo_masked", config={}).batch["advantages"]
    keep = [i for i in range(len(keys)) if i not in set(plan.no_gradient)]
    ref = DataProto.from_dict(
        {"response_mask": torch.ones(len(keep), width, dtype=torch.int64), "token_level_rewards": scores[keep]},
        non_tensors={"uid": uids[keep]},
    )
    want = compute_advantage_for_multi_trajectories(ref, [keys[i] for i in keep], "grpo", config={}).batch["advantages"]
    diff = float((ours[keep] - want).abs().max())
    assert diff == 0.0 and float(ours[list(plan.no_gradient)].abs().sum()) == 0.0
    assert float(ours[keep].abs().sum()) > 0  # the valid samples do carry a signal
    record_property(
        "observed",
        f"{len(masked)}/{len(samples)} samples masked (the executor cut {cut} of {calls} answers), all "
        f"executor_truncated; {len(plan.no_gradient)} rows without gradient ({plan.dropped_groups} group(s) left "
        f"with < 2 valid samples), advantage 0; valid advantages vs VERL's GRPO without them: max |diff| {diff:g}",
    )


def test_hung_executor(
    examples: list[GoldenExample], record_property: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """An executor that accepts and never answers, during a C1 step: every sample is masked executor_failed
    within the deadline budget (attempts × attempt timeout + back-off), and the step stops naming the cause and
    the executor (its served model, from the reward API's /info)."""
    import time

    from tests.trainer.in_verl.test_mask_mode import InjectedFailuresTransferQueue, batch_of, trainer_with
    from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    docs = [ex for ex in examples if len(ex.schema_dict()["columns"]) >= 2][:2]
    samples = [
        (f"g{g}_{s}_0", pred, json.dumps({"text": ex.text, "schema": ex.schema_dict(), "table": ex.table_dict()}))
        for g, ex in enumerate(docs)
        for s, pred in enumerate(schema_variants(ex)[:2])
    ]
    env = _env()  # attempt timeout 1 s, 1 retry, request deadline 3 s: the budget at a test's scale
    budget = (int(env["REWARD_API_RETRIES"]) + 1) * float(env["REWARD_API_EXECUTOR_TIMEOUT_S"]) + 0.5
    record_property("tried", "a C1 step's 4 samples against an executor that never answers (attempt 1 s, 1 retry)")
    record_property(
        "expected", f"all masked executor_failed within {budget:g} s + 2 s; the step stops naming the executor"
    )
    with FaultyExecutor(mode="hang", hang_s=60) as fx, RewardApiServer(_env(fx.url)) as api:
        monkeypatch.setenv("TRAINER_REWARD_URL", api.url)
        t0 = time.monotonic()
        parts = asyncio.run(score_all(samples))
        elapsed = time.monotonic() - t0
        cfg = compose_phase("c1_grpo", tmp_path, "/nonexistent", ("failures.mode=mask",))
        cfg.reward.custom_reward_function.reward_kwargs.url = api.url
        cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
        tq = InjectedFailuresTransferQueue(
            {"g0": [0, 0], "g1": [0, 0]}, set(), parts=dict(zip([k for k, *_ in samples], parts, strict=True))
        )
        trainer = trainer_with(tq, cfg, monkeypatch)
        with pytest.raises(RolloutFailureError) as stopped:
            trainer._compute_advantage(batch_of(tq), {})
    assert all(p["masked"] == 1.0 and p["executor_failed"] == 1.0 for p in parts), parts
    assert elapsed <= budget + 2.0, elapsed
    message = str(stopped.value)
    assert "4 of 4 samples failed (4 of them masked)" in message and "executor_failed (4 samples)" in message
    assert f"executor: model '{fx.model}' behind the reward API at {api.url} (1 replica(s), 1.0 s an attempt" in message
    record_property("observed", f"4/4 masked executor_failed after {elapsed:.1f} s; stopped: {message[-260:]}")


def test_dead_reward_api(
    examples: list[GoldenExample], record_property: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The reward API dies between two C1 steps (SIGKILL, as the GRPO smoke did it mid-phase): step 1 is scored and
    its advantage computed as usual; step 2's samples are all masked ``reward_call_failed`` within the client's
    deadline (a refused connection, 2 attempts, a 3 s deadline instead of the default 420 s), and the step stops
    with the failure policy's error naming the cause and the reward endpoint. A reward function that raised instead of
    masking would fail ``score_all``; one that penalized would leave ``masked`` 0."""
    import os
    import signal
    import time

    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import trainer_base

    from tests.trainer.in_verl.test_mask_mode import InjectedFailuresTransferQueue, batch_of, trainer_with
    from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase
    from trainer.phase_rules.rollout_failures import RolloutFailureError

    docs = [ex for ex in examples if len(ex.schema_dict()["columns"]) >= 2][:2]
    samples = [
        (f"g{g}_{s}_0", pred, json.dumps({"text": ex.text, "schema": ex.schema_dict(), "table": ex.table_dict()}))
        for g, ex in enumerate(docs)
        for s, pred in enumerate(schema_variants(ex)[:2])
    ]
    keys = [k for k, *_ in samples]
    deadline_s, attempts = 3.0, 2
    # the phase's own reward_kwargs (failure_log under its checkpoints), with short client deadlines
    client = (f"timeout_s={deadline_s}", "attempt_timeout_s=1.0", f"max_attempts={attempts}", "backoff_s=0.05")
    cfg = compose_phase(
        "c1_grpo",
        tmp_path,
        "/nonexistent",
        ("failures.mode=mask", *(f"+reward.custom_reward_function.reward_kwargs.{c}" for c in client)),
    )
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 2, 2
    record_property(
        "tried", f"a C1 step's {len(samples)} samples scored, then the reward API SIGKILLed and scored again"
    )
    record_property(
        "expected",
        f"step 1 unmasked; step 2 all masked reward_call_failed within {deadline_s:g} s + 1 s, and the step stops "
        "naming reward_call_failed and the reward endpoint",
    )
    with FaultyExecutor(content=gold_ndjson(docs[0].table_dict())) as fx, RewardApiServer(_env(fx.url)) as api:
        cfg.reward.custom_reward_function.reward_kwargs.url = api.url
        kwargs = OmegaConf.to_container(cfg.reward.custom_reward_function.reward_kwargs)
        assert isinstance(kwargs, dict)
        failure_log = tmp_path / "checkpoints" / "reward_failures.jsonl"
        assert kwargs["failure_log"] == str(failure_log) and kwargs["failure_mode"] == "mask"
        up = asyncio.run(score_all(samples, **kwargs))
        tq = InjectedFailuresTransferQueue({"g0": [0, 0], "g1": [0, 0]}, set(), parts=dict(zip(keys, up, strict=True)))
        trainer = trainer_with(tq, cfg, monkeypatch)  # built while the API is up, as a phase's trainer is
        step1: dict[str, Any] = {}
        trainer._compute_advantage(batch_of(tq), step1)
        assert not failure_log.exists()  # step 1 recorded no failure
        assert api.proc is not None
        os.killpg(api.proc.pid, signal.SIGKILL)
        api.proc.wait(timeout=30)  # dead and its port closed before the next step's rewards
        t0 = time.monotonic()
        down = asyncio.run(score_all(samples, **kwargs))
        elapsed = time.monotonic() - t0
        calls = fx.calls
    assert all(p["masked"] == 0.0 and p["reward_call_failed"] == 0.0 for p in up), up
    assert calls == len(samples) and any(p["score"] > 0 for p in up)  # the executor answered, the rewards are real
    assert step1["training/masked/samples"] == 0.0 and step1["training/masked/reward_call_failed"] == 0.0
    for p in down:  # masked: score 0, the cause flagged, every other part 0 (a penalty would set masked 0)
        assert p["masked"] == 1.0 and p["reward_call_failed"] == 1.0, p
        assert all(v == 0.0 for k, v in p.items() if k not in ("masked", "reward_call_failed")), p
    assert elapsed <= deadline_s + 1.0, elapsed
    endpoint = f"{api.url}/reward/pipeline"
    logged = [json.loads(line) for line in failure_log.read_text().splitlines()]
    assert sorted(e["id"] for e in logged) == sorted(keys)
    assert all(
        e["error"].startswith(f"RewardServiceError: {endpoint}: ConnectError after {attempts} attempts") for e in logged
    )

    tq = InjectedFailuresTransferQueue({"g0": [0, 0], "g1": [0, 0]}, set(), parts=dict(zip(keys, down, strict=True)))
    monkeypatch.setattr(trainer_base, "tq", tq)
    trainer.global_steps = 2
    step2: dict[str, Any] = {}
    with pytest.raises(RolloutFailureError) as stopped:
        trainer._compute_advantage(batch_of(tq), step2)
    message = str(stopped.value)
    assert message.startswith("training step 2: 4 of 4 samples failed (4 of them masked)"), message
    assert "Cause: masked: reward_call_failed (4 samples)" in message, message
    assert f"RewardServiceError: {endpoint}: ConnectError after {attempts} attempts" in message, message
    assert step2["training/masked/reward_call_failed"] == 4.0
    failure = json.loads((tmp_path / "checkpoints" / "phase_failure.json").read_text())
    assert failure["step"] == 2 and failure["failed"] == 4 and failure["message"] == message
    record_property("observed", f"4/4 masked reward_call_failed after {elapsed:.2f} s; stopped: {message[:300]}")

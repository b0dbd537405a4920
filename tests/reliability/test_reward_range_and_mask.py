"""Impossible rewards and mask defaults: what the trainer does with a reward API that answers NaN, inf or a reward
outside its declared range, which failure mode every profile (the demo's included) trains in, and golden data
without a test split.

The reward API is the real app (``services.reward_api``, uvicorn in a thread) behind ``FaultInjectingRewardApi``,
which replaces the reward of chosen items by an impossible one; the trainer's own reward function
(``trainer/in_verl/reward_fn.py``) scores through it, and the stop is ``PhaseTrainer``'s on the composed phase
config (VERL's real advantage path, the TransferQueue injected as in ``test_trainer_failures.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import GoldenExample, canonical_schema_json, compute_schema_reward_single, golden_filename
from tests.helpers.faulty_reward_api import FaultInjectingRewardApi
from tests.helpers.servers import ThreadServer

# item-id prefix → the impossible reward the injector answers for it, and the cause the client must name
IMPOSSIBLE = {"nan": math.nan, "inf": math.inf, "big": 1e9, "neg": -5.0}
CAUSES = {"nan": "reward_not_finite", "inf": "reward_not_finite", "big": "reward_out_of_range",
          "neg": "reward_out_of_range"}  # fmt: skip


@pytest.fixture(scope="module")
def injected_api() -> Iterator[tuple[str, FaultInjectingRewardApi]]:
    from services.reward_api.app import create_app
    from services.reward_api.settings import Settings

    injector = FaultInjectingRewardApi(create_app(Settings(log_level="WARNING")), IMPOSSIBLE)
    with ThreadServer(injector) as server:
        yield server.url, injector


def schema_samples(examples: list[GoldenExample], groups: int, faulty: dict[str, str]) -> list[tuple[str, str, str]]:
    """``groups`` prompt groups of 4 schema samples (VERL's keys ``{uid}_{session}_0``); the sample at key ``k`` of
    ``faulty`` gets an id with that prefix, so the injector answers its impossible reward."""
    docs = [ex for ex in examples if len(ex.schema_dict()["columns"]) >= 3][:groups]
    out = []
    for g, ex in enumerate(docs):
        gold = ex.schema_dict()
        cols = gold["columns"]
        variants = [gold, {**gold, "columns": cols[:-1]}, {**gold, "columns": cols[1:]}, {**gold, "columns": cols[:1]}]
        for s, schema in enumerate(variants):
            key = f"g{g}_{s}_0"
            item_id = f"{faulty[key]}-{key}" if key in faulty else key
            out.append((item_id, canonical_schema_json(schema), json.dumps({"schema": gold})))
    return out


def score_all(samples: list[tuple[str, str, str]], **kwargs: Any) -> list[dict[str, float]]:
    """Every sample through the trainer's reward function at once (its batcher coalesces them)."""
    from trainer.in_verl.reward_batcher import batchers_of_running_loop
    from trainer.in_verl.reward_fn import compute_score

    async def run() -> list[dict[str, float]]:
        try:
            return list(
                await asyncio.gather(*(compute_score("schema", p, gt, {"id": i}, **kwargs) for i, p, gt in samples))
            )
        finally:
            for b in batchers_of_running_loop():
                await b.aclose()

    return asyncio.run(run())


def key_of(item_id: str) -> str:
    return item_id.split("-", 1)[-1]


def test_impossible_rewards_masked_and_counted(
    injected_api: tuple[str, FaultInjectingRewardApi], examples: list[GoldenExample], record_property: Any
) -> None:
    """A reward API answering NaN, inf, 1e9 and -5 (declared range -1..1) for 4 of 16 samples: each is masked with its
    cause and counted per cause in the step's metrics; the other 12 keep exactly the service's reward."""
    from trainer.phase_rules.failure_mask import plan_training_mask

    url, injector = injected_api
    faulty = {"g0_1_0": "nan", "g1_2_0": "inf", "g2_0_0": "big", "g3_3_0": "neg"}
    samples = schema_samples(examples, 4, faulty)
    record_property("tried", "16 schema samples through reward_fn (mask mode); the reward API answers NaN, inf, 1e9, "
                             "-5 for 4 of them (declared range -1..1)")  # fmt: skip
    record_property("expected", "those 4 masked (reward_not_finite 2, reward_out_of_range 2), score 0, counted in "
                                "training/masked/<cause>; the 12 others the service's reward, unmasked")  # fmt: skip
    before = len(injector.injected)
    parts = score_all(samples, url=url, max_wait_ms=200)
    assert len(injector.injected) - before == len(faulty)
    for (item_id, pred, gt), p in zip(samples, parts, strict=True):
        prefix = item_id.split("-", 1)[0]
        if prefix in CAUSES:
            assert p["masked"] == 1.0 and p[CAUSES[prefix]] == 1.0 and p["score"] == 0.0, (item_id, p)
        else:
            want = compute_schema_reward_single(pred, json.loads(gt)["schema"]).reward
            assert p["masked"] == 0.0 and p["score"] == want and math.isfinite(p["score"]), (item_id, p)
    plan = plan_training_mask([key_of(i) for i, *_ in samples], parts)
    metrics = plan.as_metrics()
    assert metrics["training/masked/reward_not_finite"] == 2.0
    assert metrics["training/masked/reward_out_of_range"] == 2.0
    assert metrics["training/masked/samples"] == 4.0 and plan.dropped_groups == 0
    assert sorted(plan.no_gradient) == sorted(i for i, (item_id, *_) in enumerate(samples) if "-g" in item_id)
    record_property(
        "observed",
        f"{plan.masked}/{len(samples)} masked ({plan.describe()}); training/masked/reward_not_finite "
        f"{metrics['training/masked/reward_not_finite']:g}, reward_out_of_range "
        f"{metrics['training/masked/reward_out_of_range']:g}; {len(samples) - plan.masked} unmasked with the "
        "service's reward",
    )


@pytest.mark.verl
def test_over_max_share_stops_naming_the_cause(
    injected_api: tuple[str, FaultInjectingRewardApi],
    examples: list[GoldenExample],
    record_property: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A B1 step (the phase config as composed, mask mode by default, max_share 0.1): 1 impossible reward in 16 is
    within the share, masked and trained around; 3 in 16 stop the step before the update, naming the causes."""
    from tests.trainer.in_verl.test_mask_mode import InjectedFailuresTransferQueue, batch_of, trainer_with
    from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase
    from trainer.phase_rules.rollout_failures import FAILURE_FILE, RolloutFailureError

    url, _ = injected_api
    cfg = compose_phase("b1_grpo", tmp_path, "/nonexistent")  # no failures.mode override: the profile's default
    assert cfg.failures.mode == cfg.reward.custom_reward_function.reward_kwargs.failure_mode == "mask"
    assert cfg.failures.max_share == 0.1
    cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n = 4, 4
    record_property("tried", "a B1 step of 16 samples (the composed config: mask, max_share 0.1) with 1, then 3 "
                             "impossible rewards from the reward API")  # fmt: skip
    record_property("expected", "1/16: masked, counted, the step goes on; 3/16: the step stops before the update, "
                                "naming reward_not_finite and reward_out_of_range")  # fmt: skip

    def step(faulty: dict[str, str], n: int) -> tuple[InjectedFailuresTransferQueue, Any, dict[str, Any]]:
        samples = schema_samples(examples, 4, faulty)
        parts = score_all(samples, url=url, max_wait_ms=200)
        keyed = {key_of(i): p for (i, *_), p in zip(samples, parts, strict=True)}
        tq = InjectedFailuresTransferQueue({f"g{g}": [0.0] * 4 for g in range(4)}, set(), parts=keyed)
        trainer = trainer_with(tq, cfg, monkeypatch)
        trainer.global_steps = n
        return tq, trainer, {}

    tq, trainer, within = step({"g1_2_0": "nan"}, 1)
    trainer._compute_advantage(batch_of(tq), within)
    assert within["training/masked/reward_not_finite"] == 1.0 and within["training/masked/share"] == 1 / 16
    assert int(tq.rows["g1_2_0"]["response_mask"].sum()) == 0  # no gradient for the masked sample
    assert float(tq.rows["g0_0_0"]["advantages"].abs().sum()) > 0  # the others are trained on

    tq, trainer, over = step({"g0_1_0": "nan", "g2_0_0": "big", "g3_3_0": "neg"}, 2)
    with pytest.raises(RolloutFailureError) as stopped:
        trainer._compute_advantage(batch_of(tq), over)
    message = str(stopped.value)
    assert message.startswith("training step 2: 3 of 16 samples failed (3 of them masked) (share 0.188"), message
    assert "Cause: masked: reward_out_of_range (2 samples); reward_not_finite (1 sample)" in message, message
    assert over["training/masked/reward_out_of_range"] == 2.0 and over["training/masked/reward_not_finite"] == 1.0
    assert not [p for p in tq.puts if "advantages" in p]  # nothing reached VERL's advantage
    failure = json.loads((tmp_path / "checkpoints" / FAILURE_FILE).read_text())
    assert failure["step"] == 2 and failure["message"] == message
    record_property("observed", f"1/16: share {within['training/masked/share']:.4f}, trained on; 3/16: {message[:260]}")


def test_demo_and_cpu_smoke_profile_default_to_mask(tmp_path: Path, record_property: Any) -> None:
    """Every GRPO phase in every profile, and the demo's C1 as the demo composes it (cpu-smoke profile, its
    overrides), trains in mask mode; penalize is opt-in by name (the CPU smokes)."""
    from tests.trainer.in_verl.test_verl_sync_trainer import compose_phase
    from trainer.demo.settings import RlSettings
    from trainer.phases.launch import CONFIG_DIR, PROFILES
    from trainer.smoke.grpo import SMOKE_FAILURE_MODE

    record_property("tried", "the GRPO phase configs composed in every profile, and the demo's C1 with its overrides")
    record_property("expected", "failures.mode mask and the reward client's failure_mode mask everywhere; no profile "
                                "config names penalize")  # fmt: skip
    modes: dict[str, str] = {}
    for phase in ("b1_grpo", "b2_grpo", "c1_grpo", "c2_grpo"):
        for profile in PROFILES:
            cfg = compose_phase(phase, tmp_path, "/nonexistent", (f"profile={profile}",))
            assert (cfg.trainer.device == "cpu") == (profile == "cpu-smoke")  # the profile asked for is composed
            modes[f"{phase}/{profile}"] = cfg.failures.mode
            assert cfg.failures.mode == cfg.reward.custom_reward_function.reward_kwargs.failure_mode == "mask"
    demo = compose_phase("c1_grpo", tmp_path, "/nonexistent", tuple(RlSettings().overrides()))
    assert demo.failures.mode == demo.reward.custom_reward_function.reward_kwargs.failure_mode == "mask"
    assert demo.failures.max_share == RlSettings().max_share
    for path in CONFIG_DIR.rglob("*.yaml"):  # no config file sets another mode
        mode = ((yaml.safe_load(path.read_text()) or {}).get("failures") or {}).get("mode", "mask")
        assert mode == "mask", path
    assert SMOKE_FAILURE_MODE == "failures.mode=penalize"  # the smokes' opt-in, by name
    record_property(
        "observed",
        f"{len(modes)} phase/profile configs: {sorted(set(modes.values()))}; the demo's C1: {demo.failures.mode}, "
        f"max_share {demo.failures.max_share}",
    )


def test_empty_split_refused_by_shared_validate(tmp_path: Path, record_property: Any) -> None:
    """``shared validate`` on a golden folder whose test split has no examples: an error naming the split, exit 1
    (it said "ok" before)."""
    from typer.testing import CliRunner

    from shared.cli import app
    from trainer.data.sample_data import SAMPLE_DIR

    folder = tmp_path / "golden"
    shutil.copytree(SAMPLE_DIR, folder)
    (folder / golden_filename("test")).write_text("")
    record_property("tried", "python -m shared validate DIR, DIR's common_test_schemas.jsonl empty")
    record_property("expected", "exit 1; the error names the test split; no 'examples valid'")
    res = CliRunner().invoke(app, ["validate", str(folder)])
    assert res.exit_code == 1, res.output
    assert "the test split is empty (no examples)" in res.output and "examples valid" not in res.output
    record_property("observed", f"exit {res.exit_code}: {' '.join(res.output.split())[:200]}")

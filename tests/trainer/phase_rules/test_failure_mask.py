"""Which samples mask mode takes out of a training batch or a validation (trainer/phase_rules/failure_mask.py)."""

from __future__ import annotations

import pytest

from shared import EXECUTOR_FAILED, EXECUTOR_TRUNCATED, PROMPT_TOO_LONG
from trainer.phase_rules.failure_mask import (
    FAILURE_CAUSES,
    SERVICE_CAUSES,
    cause_of,
    group_of,
    plan_training_mask,
    split_validation,
)


def masked(cause: str) -> dict[str, float]:
    return {"masked": 1.0, cause: 1.0, "score": 0.0}


OK = {"masked": 0.0, "score": 0.7}


def test_the_causes_are_the_reward_services_errors_the_failed_call_and_the_impossible_reward() -> None:
    assert SERVICE_CAUSES == (EXECUTOR_FAILED, EXECUTOR_TRUNCATED, PROMPT_TOO_LONG)
    assert FAILURE_CAUSES[len(SERVICE_CAUSES) :] == ("reward_call_failed", "reward_not_finite", "reward_out_of_range")
    assert FAILURE_CAUSES[: len(SERVICE_CAUSES)] == SERVICE_CAUSES
    assert cause_of(masked("reward_out_of_range")) == "reward_out_of_range"
    assert cause_of(masked("prompt_too_long")) == "prompt_too_long"
    assert cause_of({"masked": 1}) == "unnamed" and cause_of(OK) is None and cause_of({}) is None
    assert cause_of({"masked": "yes"}) is None  # not a number: not a mask


def test_a_group_left_with_one_valid_sample_is_dropped_whole() -> None:
    keys = ["a_0_0", "a_1_0", "a_2_0", "b_0_0", "b_1_0", "c_0_0", "c_1_0", "pad1_0_0"]
    infos = [OK, masked("executor_truncated"), OK, masked("executor_failed"), OK, OK, OK, masked("executor_failed")]
    plan = plan_training_mask(keys, infos, padding=[False] * 7 + [True])
    assert plan.no_gradient == (1, 3, 4)  # a keeps two valid samples; b is left with one, dropped whole
    assert plan.causes == {"executor_truncated": 1, "executor_failed": 1}  # the padding row is not counted
    assert plan.samples == 7 and plan.masked == 2 and plan.dropped_groups == 1
    metrics = plan.as_metrics()
    assert metrics["training/masked/share"] == pytest.approx(2 / 7) and metrics["training/masked/no_gradient"] == 3
    assert metrics["training/masked/prompt_too_long"] == 0.0
    assert plan.describe() == "masked: executor_truncated (1 sample); executor_failed (1 sample)"


def test_nothing_masked_is_an_empty_plan_and_bad_input_is_named() -> None:
    plan = plan_training_mask(["a_0_0", "a_1_0"], [OK, OK])
    assert plan.no_gradient == () and plan.masked == 0 and plan.describe() == ""
    with pytest.raises(ValueError, match="2 keys, 1 reward infos"):
        plan_training_mask(["a_0_0", "a_1_0"], [OK])
    with pytest.raises(ValueError, match="unexpected trajectory key 'a0'"):
        group_of("a0")
    assert group_of("uid_with_underscores_3_0") == "uid_with_underscores"


def test_validation_keeps_the_unmasked_rows() -> None:
    infos = {"reward": [0.5, 0.0, 0.9], "masked": [0, 1, 0], "reward_call_failed": [0, 1, 0]}
    keep, plan = split_validation(infos, 3)
    assert keep == [0, 2] and plan.causes == {"reward_call_failed": 1} and plan.as_metrics()[
        "validation/masked/share"
    ] == pytest.approx(1 / 3)
    assert split_validation({"reward": [0.5]}, 1)[0] == [0]  # a reward function without masks: all kept

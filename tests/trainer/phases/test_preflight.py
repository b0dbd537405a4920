"""The advantage check: groups whose rewards are all equal are counted as teaching nothing."""

from __future__ import annotations

import pytest

from trainer.phases.preflight import PHASE_STAGE, group_stats


def test_all_equal_groups_are_not_informative() -> None:
    informative, mean, spread = group_stats([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [-1.0, 1.0, 1.0]])
    assert informative == 1
    assert mean == pytest.approx((3 + 1.5 + 1) / 9)
    assert spread == pytest.approx((0 + 0 + 0.9428090) / 3, rel=1e-6)


def test_tiny_float_noise_is_still_equal() -> None:
    assert group_stats([[0.3, 0.3 + 1e-12]])[0] == 0


@pytest.mark.parametrize("bad", [[], [[1.0]]])
def test_groups_need_two_samples(bad: list[list[float]]) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        group_stats(bad)


def test_every_grpo_phase_has_a_stage() -> None:
    assert PHASE_STAGE == {"b1": "schema", "b2": "table", "c1": "pipeline", "c2": "table"}


@pytest.mark.vllm
@pytest.mark.service
def test_advantage_check_through_a_real_policy_and_reward_api(cpu_executor: object, tmp_path: object) -> None:
    from pathlib import Path

    from tests.helpers.servers import RewardApiServer
    from trainer.data.sample_data import SAMPLE_DIR
    from trainer.phases.preflight import advantage_check, write_report

    with RewardApiServer() as api:
        rep = advantage_check(
            SAMPLE_DIR, "schema", cpu_executor.url, cpu_executor.served_model_name, api.url,  # type: ignore[attr-defined]
            n=2, prompts=2, max_tokens=32, min_informative=0.5,
        )  # fmt: skip
    assert (rep.stage, rep.prompts, rep.n) == ("schema", 2, 2)
    assert rep.informative_share == rep.informative_groups / 2 and rep.ok == (rep.informative_share >= 0.5)
    # the base SmolLM2 writes no schema JSON in 32 tokens: its rewards sit at the invalid penalty
    assert -1.0 <= rep.mean_reward < 0.0
    out = Path(str(tmp_path)) / "preflight.json"
    write_report(rep, out)
    assert '"informative_share"' in out.read_text()

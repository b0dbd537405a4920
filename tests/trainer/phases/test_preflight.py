"""The advantage check: groups whose rewards are all equal are counted as teaching nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainer.phases.preflight import PHASE_STAGE, choose_temperature, group_stats, read_sweep


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


def _report(folder: Path, phase: str, t: float, share: float, mean: float = 0.9) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rep = {"stage": PHASE_STAGE[phase], "prompts": 64, "n": 8, "temperature": t, "informative_groups": int(share * 64),
           "informative_share": share, "mean_reward": mean, "mean_group_std": 0.01, "min_informative": 0.0, "ok": True}
    (folder / f"{phase}_t{t}.json").write_text(json.dumps(rep))  # fmt: skip


def test_the_lowest_temperature_where_every_phase_has_signal_wins(tmp_path: Path) -> None:
    for t, b1, c1 in [(1.0, 0.2, 0.6), (1.3, 0.55, 0.7), (1.6, 0.8, 0.9)]:
        _report(tmp_path, "b1", t, b1)
        _report(tmp_path, "c1", t, c1)
    sweep = read_sweep(tmp_path, ["b1", "c1"])
    assert list(sweep) == [1.0, 1.3, 1.6] and sweep[1.3]["b1"] == (0.55, 0.9)
    choice = choose_temperature(sweep, 0.5)
    assert (choice.temperature, choice.reached) == (1.3, True)  # 1.0 fails on b1; 1.6 is not the lowest
    assert choose_temperature(sweep, 0.1).temperature == 1.0
    assert choose_temperature(sweep, 0.0).temperature == 1.0


def test_no_temperature_reaching_the_share_gives_the_best_worst_phase_and_says_so(tmp_path: Path) -> None:
    for t, b1, c1 in [(1.0, 0.1, 0.4), (1.3, 0.3, 0.2), (1.6, 0.3, 0.5)]:
        _report(tmp_path, "b1", t, b1)
        _report(tmp_path, "c1", t, c1)
    choice = choose_temperature(read_sweep(tmp_path, ["b1", "c1"]), 0.5)
    assert (choice.temperature, choice.reached) == (1.6, False)  # worst phase: 0.1, 0.2, 0.3
    assert "no temperature reaches 50%" in choice.reason and "30%" in choice.reason
    assert choice.as_dict()["sweep"]["1.6"]["c1"] == {"informative_share": 0.5, "mean_reward": 0.9}


def test_a_temperature_missing_a_phase_is_not_a_candidate(tmp_path: Path) -> None:
    _report(tmp_path, "b1", 1.0, 0.9)
    _report(tmp_path, "b1", 1.3, 0.9)
    _report(tmp_path, "c1", 1.3, 0.6)
    assert list(read_sweep(tmp_path, ["b1", "c1"])) == [1.3]
    with pytest.raises(ValueError, match=r"no temperature with a report for every phase of \['b1', 'c1', 'b2'\]"):
        read_sweep(tmp_path, ["b1", "c1", "b2"])


def test_a_broken_report_names_its_file(tmp_path: Path) -> None:
    (tmp_path / "b1_t1.0.json").write_text(json.dumps({"temperature": 1.0}))
    with pytest.raises(ValueError, match=r"b1_t1.0.json: not a preflight report"):
        read_sweep(tmp_path, ["b1"])


def test_preflight_choose_prints_only_the_temperature_and_writes_the_choice(tmp_path: Path) -> None:
    from trainer.phases.cli import app

    for t, share in [(1.0, 0.25), (1.5, 0.75)]:
        _report(tmp_path / "sweep", "b1", t, share)
    out = tmp_path / "choice.json"
    res = CliRunner().invoke(app, ["preflight-choose", "--dir", str(tmp_path / "sweep"), "--phases", "b1",
                                   "--min-share", "0.5", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == "1.5"
    assert json.loads(out.read_text())["temperature"] == 1.5 and json.loads(out.read_text())["reached"] is True
    bad = CliRunner().invoke(app, ["preflight-choose", "--dir", str(tmp_path / "sweep"), "--phases", "c1"])
    text = " ".join(bad.output.replace("│", " ").split())  # the error box wraps lines
    assert bad.exit_code == 2 and "--dir" in text and "no temperature with a report for every phase" in text

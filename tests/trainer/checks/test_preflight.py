"""The advantage check: groups whose rewards are all equal are counted as teaching nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainer.checks.preflight import (
    PromptOutcome,
    SweepPoint,
    build_report,
    choose_temperature,
    group_stats,
    headroom_stats,
    improvable_prompt_set,
    macro,
    outcomes_from_results,
    per_source,
    read_sweep,
    sample_per_source,
)
from trainer.registry.phases import reward_of


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


@pytest.mark.vllm
@pytest.mark.service
def test_advantage_check_through_a_real_policy_and_reward_api(cpu_executor: object, tmp_path: object) -> None:
    from pathlib import Path

    from tests.helpers.servers import RewardApiServer
    from trainer.checks.preflight import advantage_check, write_report
    from trainer.data.sample_data import SAMPLE_DIR

    with RewardApiServer() as api:
        rep = advantage_check(
            SAMPLE_DIR, "schema", cpu_executor.url, cpu_executor.served_model_name, api.url,  # type: ignore[attr-defined]
            n=2, prompts=1, max_tokens=32, min_informative=0.5, min_improvable=0.0,
        )  # fmt: skip
    assert (rep.reward, rep.n) == ("schema", 2) and rep.prompts == len(rep.per_source) >= 1
    assert 0 <= rep.informative_groups <= 2 and rep.ok == (rep.informative_share >= 0.5 and rep.headroom)
    assert rep.informative_share == pytest.approx(
        sum(s["informative_share"] for s in rep.per_source.values()) / len(rep.per_source), abs=1e-4
    )
    # the base SmolLM2 writes no schema JSON in 32 tokens: its rewards sit at the invalid penalty
    assert -1.0 <= rep.mean_reward < 0.0
    out = Path(str(tmp_path)) / "preflight.json"
    write_report(rep, out)
    assert '"informative_share"' in out.read_text()


@pytest.mark.service
@pytest.mark.parametrize(("sample_in_flight", "greedy_in_flight"), [(5, 3), (2, 7)])
def test_advantage_check_holds_its_calls_in_flight(sample_in_flight: int, greedy_in_flight: int) -> None:
    """Sampling and greedy requests each run at their own concurrency (the default 16 left most of a GPU
    executor idle). The policy is slowed on purpose, so the calls overlap."""
    from tests.helpers.faulty_executor import FaultyExecutor
    from tests.helpers.servers import RewardApiServer
    from trainer.checks.preflight import advantage_check
    from trainer.data.sample_data import SAMPLE_DIR

    with FaultyExecutor("ok", content='{"a": "string"}', delay_s=0.5) as policy, RewardApiServer() as api:
        rep = advantage_check(
            SAMPLE_DIR, "schema", policy.url, policy.model, api.url, n=3, prompts=20, max_tokens=32,
            min_informative=0.0, min_improvable=0.0, sample_in_flight=sample_in_flight,
            greedy_in_flight=greedy_in_flight,
        )  # fmt: skip
        sampled = [r for r in policy.requests if r.get("n") == 3]
        greedy = [r for r in policy.requests if "n" not in r]
        assert len(sampled) == len(greedy) == rep.prompts >= 8
        assert policy.max_in_flight == max(sample_in_flight, greedy_in_flight)


def _report(
    folder: Path, phase: str, t: float, share: float, mean: float = 0.9, improvable: float | None = None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rep = {"reward": reward_of(phase), "prompts": 64, "n": 8, "temperature": t, "informative_groups": int(share * 64),
           "informative_share": share, "mean_reward": mean, "mean_group_std": 0.01, "min_informative": 0.0, "ok": True}
    if improvable is not None:
        rep |= {"improvable_share": improvable, "best_minus_greedy": 0.1, "invalid_share": 0.05}
    (folder / f"{phase}_t{t}.json").write_text(json.dumps(rep))  # fmt: skip


def test_the_lowest_temperature_where_every_phase_has_signal_wins(tmp_path: Path) -> None:
    for t, b1, c1 in [(1.0, 0.2, 0.6), (1.3, 0.55, 0.7), (1.6, 0.8, 0.9)]:
        _report(tmp_path, "b1", t, b1)
        _report(tmp_path, "c1", t, c1)
    sweep = read_sweep(tmp_path, ["b1", "c1"])
    assert list(sweep) == [1.0, 1.3, 1.6] and sweep[1.3]["b1"] == SweepPoint(0.55, 0.9)
    choice = choose_temperature(sweep, 0.5, "informative")
    assert (choice.temperature, choice.reached) == (1.3, True)  # 1.0 fails on b1; 1.6 is not the lowest
    assert choose_temperature(sweep, 0.1, "informative").temperature == 1.0
    assert choose_temperature(sweep, 0.0, "informative").temperature == 1.0
    # the default criterion needs the improvable share, which an issue-12 report does not have
    with pytest.raises(ValueError, match="no improvable_share"):
        choose_temperature(sweep, 0.1)


def test_no_temperature_reaching_the_share_gives_the_best_worst_phase_and_says_so(tmp_path: Path) -> None:
    for t, b1, c1 in [(1.0, 0.1, 0.4), (1.3, 0.3, 0.2), (1.6, 0.3, 0.5)]:
        _report(tmp_path, "b1", t, b1)
        _report(tmp_path, "c1", t, c1)
    choice = choose_temperature(read_sweep(tmp_path, ["b1", "c1"]), 0.5, "informative")
    assert (choice.temperature, choice.reached) == (1.6, False)  # worst phase: 0.1, 0.2, 0.3
    assert "no temperature reaches 50% informative groups" in choice.reason and "30%" in choice.reason
    assert choice.no_headroom == ("b1",)  # c1 has 0.5 at 1.6
    assert choice.as_dict()["sweep"]["1.6"]["c1"] == {
        "informative_share": 0.5, "mean_reward": 0.9, "improvable_share": None, "best_minus_greedy": None,
        "invalid_share": None,
    }  # fmt: skip


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
                                   "--criterion", "informative", "--min-share", "0.5", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == "1.5"
    assert json.loads(out.read_text())["temperature"] == 1.5 and json.loads(out.read_text())["reached"] is True
    bad = CliRunner().invoke(app, ["preflight-choose", "--dir", str(tmp_path / "sweep"), "--phases", "c1"])
    text = " ".join(bad.output.replace("│", " ").split())  # the error box wraps lines
    assert bad.exit_code == 2 and "--dir" in text and "no temperature with a report for every phase" in text


# -- what GRPO can use (improvable share per source, best-of-n - greedy, invalid share) --------


def _o(id_: str, greedy: float, samples: list[float], valid: list[bool] | None = None) -> PromptOutcome:
    return PromptOutcome(id_, greedy, tuple(samples), tuple(valid if valid is not None else [True] * len(samples)))


def test_a_group_that_differs_is_not_improvable_unless_a_sample_beats_greedy() -> None:
    mode = _o("e2e-1", 1.0, [1.0] * 7 + [0.2])  # one worse sample: informative, sharpens the mode only
    better = _o("e2e-2", 0.5, [0.5, 0.5, 0.8, 0.5])
    flat = _o("e2e-3", 0.7, [0.7, 0.7])
    noise = _o("e2e-4", 0.7, [0.7 + 1e-12, 0.7])
    assert [o.informative for o in (mode, better, flat, noise)] == [True, True, False, False]
    assert [o.improvable for o in (mode, better, flat, noise)] == [False, True, False, False]
    assert better.best_minus_greedy == pytest.approx(0.3) and mode.best_minus_greedy == 0.0


def test_headroom_stats_of_one_source() -> None:
    st = headroom_stats([
        _o("wikitabletext-1", 0.2, [0.2, 0.6, -1.0, 0.2], [True, True, False, True]),
        _o("wikitabletext-2", 0.9, [0.9, 0.9, 0.9, 0.9]),
        _o("wikitabletext-3", -1.0, [-1.0, 0.0, -1.0, -1.0], [False, True, False, False]),
    ])  # fmt: skip
    assert st.prompts == 3
    assert st.informative_share == pytest.approx(2 / 3) and st.improvable_share == pytest.approx(2 / 3)
    assert st.best_minus_greedy == pytest.approx((0.4 + 0.0 + 1.0) / 3)
    assert st.invalid_share == pytest.approx(4 / 12)
    assert st.mean_reward == pytest.approx((0.0 + 3.6 - 3.0) / 12)
    assert st.greedy_reward == pytest.approx((0.2 + 0.9 - 1.0) / 3)


def test_macro_counts_each_source_once_and_the_report_names_sources_without_headroom() -> None:
    outcomes = [_o("wikitabletext-1", 0.2, [0.2, 0.8]), _o("wikitabletext-2", 0.5, [0.5, 0.9])]
    outcomes += [_o(f"rotowire_sent-{i}", 1.0, [1.0, 1.0]) for i in range(8)]  # 8 prompts, no headroom
    by = per_source(outcomes)
    assert list(by) == ["rotowire_sent", "wikitabletext"]
    assert by["wikitabletext"].improvable_share == 1.0 and by["rotowire_sent"].improvable_share == 0.0
    m = macro(by)
    assert m.prompts == 10 and m.improvable_share == pytest.approx(0.5)  # pooled would say 0.2
    assert m.best_minus_greedy == pytest.approx((0.5 + 0.0) / 2)
    rep = build_report("table", outcomes, 1.0, min_improvable=0.1)
    assert rep.headroom and rep.ok and rep.improvable_share == 0.5 and rep.informative_groups == 2
    assert rep.no_headroom_sources == ["rotowire_sent"]
    assert rep.improvable_ids == ["wikitabletext-1", "wikitabletext-2"]
    assert rep.per_source["wikitabletext"]["best_minus_greedy"] == pytest.approx(0.5)
    assert "no headroom in rotowire_sent" in rep.verdict()


def test_below_the_threshold_is_reported_as_no_headroom_and_not_ok() -> None:
    outcomes = [_o(f"e2e-{i}", 1.0, [1.0, 0.5, 1.0]) for i in range(19)] + [_o("e2e-19", 0.5, [1.0, 0.5, 0.5])]
    rep = build_report("schema", outcomes, 1.3, min_informative=0.25, min_improvable=0.10)
    assert rep.informative_share == 1.0  # every group differs: a check of differing groups alone would pass
    assert rep.improvable_share == pytest.approx(0.05) and not rep.headroom and not rep.ok
    assert rep.verdict().startswith("NO HEADROOM: schema at temperature 1.3") and "5% of prompts" in rep.verdict()
    assert build_report("schema", outcomes, 1.3, min_improvable=0.05).headroom  # at the threshold: enough


def test_outcomes_from_results_reads_n_samples_then_greedy_per_prompt() -> None:
    from shared import read_golden
    from trainer.data.sample_data import SAMPLE_DIR

    picked = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl")[:2]
    res = [{"reward": r, "valid_json": r > -1} for r in (0.1, 0.2, 0.3, -1.0, 0.4, 0.5, 0.15, 0.0)]
    a, b = outcomes_from_results(picked, 3, res)
    assert (a.id, a.samples, a.greedy) == (picked[0].id, (0.1, 0.2, 0.3), 0.15)
    assert (b.samples, b.samples_valid, b.greedy) == ((-1.0, 0.4, 0.5), (False, True, True), 0.0)
    with pytest.raises(ValueError, match="expected 8 results"):
        outcomes_from_results(picked, 3, res[:-1])


def test_sample_per_source_is_stratified_seeded_and_filterable() -> None:
    from shared import read_golden
    from shared.golden import source_of
    from trainer.data.sample_data import SAMPLE_DIR

    examples = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl")
    sizes = {s: sum(source_of(e.id) == s for e in examples) for s in {source_of(e.id) for e in examples}}
    picked = sample_per_source(examples, 2, seed=3)
    assert [source_of(e.id) for e in picked] == [s for s in sorted(sizes) for _ in range(min(2, sizes[s]))]
    assert [e.id for e in picked] == [e.id for e in sample_per_source(examples, 2, seed=3)]
    one = sorted(sizes)[0]
    assert {source_of(e.id) for e in sample_per_source(examples, 99, sources=[one])} == {one}
    assert len(sample_per_source(examples, 99, sources=[one])) == sizes[one]
    with pytest.raises(ValueError, match="have no training example"):
        sample_per_source(examples, 2, sources=["nope"])


def test_the_improvable_temperature_uses_the_macro_share(tmp_path: Path) -> None:
    # b1 gains improvable prompts with temperature; c1 is flat; 1.6 would be the informative choice too
    for t, b1, c1 in [(0.7, 0.04, 0.2), (1.0, 0.12, 0.2), (1.3, 0.3, 0.25)]:
        _report(tmp_path, "b1", t, 0.9, improvable=b1)
        _report(tmp_path, "c1", t, 0.9, improvable=c1)
    sweep = read_sweep(tmp_path, ["b1", "c1"])
    assert sweep[1.0]["b1"] == SweepPoint(0.9, 0.9, 0.12, 0.1, 0.05)
    choice = choose_temperature(sweep, 0.10)
    assert (choice.temperature, choice.reached, choice.criterion) == (1.0, True, "improvable")
    assert "10% improvable prompts" in choice.reason and choice.no_headroom == ()
    none = choose_temperature(sweep, 0.5)
    assert (none.temperature, none.reached, none.no_headroom) == (1.3, False, ("b1", "c1"))


def test_preflight_choose_names_phases_without_headroom(tmp_path: Path) -> None:
    from trainer.phases.cli import app

    _report(tmp_path, "b1", 1.0, 0.9, improvable=0.02)
    _report(tmp_path, "b2", 1.0, 0.9, improvable=0.4)
    res = CliRunner().invoke(app, ["preflight-choose", "--dir", str(tmp_path), "--phases", "b1,b2"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == "1.0"
    assert "NO HEADROOM: b1 at temperature 1.0" in res.output and "NO HEADROOM: b2" not in res.output


def _rl_parquet(path: Path) -> list[str]:
    from shared import read_golden
    from trainer.data.datasets import RL_SCHEMA, rl_row, write_parquet
    from trainer.data.sample_data import SAMPLE_DIR

    examples = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl")[:4]
    write_parquet([rl_row("b2", ex, i, "train") for i, ex in enumerate(examples)], path, RL_SCHEMA)
    return [ex.id for ex in examples]


def test_improvable_prompt_set_keeps_rows_by_id_in_the_same_format(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    ids = _rl_parquet(tmp_path / "train.parquet")
    kept, missing = improvable_prompt_set(tmp_path / "train.parquet", [ids[3], ids[1], "e2e-not-there"],
                                          tmp_path / "improvable.parquet")  # fmt: skip
    assert (kept, missing) == (2, ["e2e-not-there"])
    src, out = pq.read_table(tmp_path / "train.parquet"), pq.read_table(tmp_path / "improvable.parquet")
    assert out.schema == src.schema
    assert out.to_pylist() == [src.to_pylist()[1], src.to_pylist()[3]]  # whole rows, file order
    with pytest.raises(ValueError, match="none of the 1 improvable ids"):
        improvable_prompt_set(tmp_path / "train.parquet", ["e2e-x"], tmp_path / "none.parquet")


def test_preflight_filter_command(tmp_path: Path) -> None:
    from trainer.phases.cli import app

    ids = _rl_parquet(tmp_path / "train.parquet")
    rep = build_report("table", [_o(ids[0], 0.0, [0.5, 0.0]), _o(ids[2], 0.5, [0.5, 0.5])], 1.0)
    (tmp_path / "b2_t1.0.json").write_text(json.dumps(rep.as_dict()))
    out = tmp_path / "b2" / "improvable.parquet"
    res = CliRunner().invoke(app, ["preflight-filter", "--report", str(tmp_path / "b2_t1.0.json"), "--train",
                                   str(tmp_path / "train.parquet"), "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "1 improvable prompts" in res.output
    import pyarrow.parquet as pq

    assert [r["extra_info"]["id"] for r in pq.read_table(out).to_pylist()] == [ids[0]]


def test_preflight_filter_drops_sources_below_the_share(tmp_path: Path) -> None:
    """--min-source-share keeps only the sources with headroom: B1 trained on
    improvable prompts of every source learned to drop columns that the E2E/RotoWire golds omit."""
    from shared import read_golden
    from trainer.data.datasets import RL_SCHEMA, rl_row, write_parquet
    from trainer.data.sample_data import SAMPLE_DIR
    from trainer.phases.cli import app

    base = read_golden(SAMPLE_DIR / "common_train_schemas.jsonl")[:4]
    examples = [ex.model_copy(update={"id": f"{src}-{i}"}) for i, (ex, src) in
                enumerate(zip(base, ["e2e", "wikitabletext", "wikitabletext", "e2e"], strict=True))]  # fmt: skip
    write_parquet([rl_row("b1", ex, i, "train") for i, ex in enumerate(examples)], tmp_path / "train.parquet",
                  RL_SCHEMA)  # fmt: skip
    outcomes = [_o("e2e-0", 0.5, [0.6, 0.5]), _o("e2e-3", 0.5, [0.5, 0.5]), _o("wikitabletext-1", 0.2, [0.6, 0.2]),
                _o("wikitabletext-2", 0.2, [0.9, 0.1])]  # fmt: skip
    rep = build_report("schema", outcomes, 1.0)  # improvable: e2e 1 of 2 (0.5), wikitabletext 2 of 2 (1.0)
    (tmp_path / "r.json").write_text(json.dumps(rep.as_dict()))

    def run(*extra: str) -> tuple[int, str, list[str]]:
        out = tmp_path / f"out{len(extra)}.parquet"
        res = CliRunner().invoke(app, ["preflight-filter", "--report", str(tmp_path / "r.json"), "--train",
                                       str(tmp_path / "train.parquet"), "--out", str(out), *extra])  # fmt: skip
        import pyarrow.parquet as pq

        ids = [r["extra_info"]["id"] for r in pq.read_table(out).to_pylist()] if res.exit_code == 0 else []
        return res.exit_code, res.output, ids

    assert run()[2] == ["e2e-0", "wikitabletext-1", "wikitabletext-2"]
    code, output, ids = run("--min-source-share", "0.6")
    assert code == 0 and ids == ["wikitabletext-1", "wikitabletext-2"]
    assert "sources below 0.6: e2e (dropped)" in output
    assert run("--min-source-share", "1.0")[2] == ["wikitabletext-1", "wikitabletext-2"]  # 1.0 >= 1.0: kept
    rep_dict = rep.as_dict()
    rep_dict["per_source"]["wikitabletext"]["improvable_share"] = 0.4
    (tmp_path / "r.json").write_text(json.dumps(rep_dict))
    code, output, _ = run("--min-source-share", "0.6")
    assert code != 0 and "no source reaches 0.6" in output

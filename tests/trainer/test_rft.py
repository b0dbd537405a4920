"""RFT baseline: selection rule and the real sample → score → parquet path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from trainer.rft import RftConfig, build_rft_data, select_best

SAMPLE = Path(__file__).resolve().parents[2] / "trainer" / "data" / "sample"


def test_select_best_threshold_and_ties() -> None:
    assert select_best([0.1, 0.7, 0.7, 0.2], 0.5) == 1
    assert select_best([0.1, 0.4], 0.5) is None
    assert select_best([-1.0], -1.0) == 0
    assert select_best([], 0.0) is None


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="k must be"):
        RftConfig(k=0)
    with pytest.raises(ValueError, match="threshold"):
        RftConfig(threshold=2.0)


@pytest.fixture(scope="module")
def reward_api() -> Any:
    from tests.helpers.servers import RewardApiServer

    with RewardApiServer() as srv:
        yield srv


@pytest.mark.vllm
@pytest.mark.service
def test_build_rft_data_with_real_policy(reward_api: Any, cpu_executor: Any, tmp_path: Path) -> None:
    cfg = RftConfig(k=2, threshold=-1.0, temperature=1.0, max_tokens=256)  # long enough for most answers to end
    rep = build_rft_data(
        SAMPLE, tmp_path, "schema", cpu_executor.url, cpu_executor.served_model_name, reward_api.url, cfg, limit=2
    )
    # threshold -1 keeps every best, of the samples that ended before max_tokens
    assert rep.prompts == 2 and rep.samples == 4 and rep.kept + rep.prompts_all_cut == 2
    rows = pq.read_table(tmp_path / "data" / "a1" / "train.parquet").to_pylist()
    assert rep.kept >= 1 and len(rows) == rep.kept
    assert [m["role"] for m in rows[0]["messages"]][-1] == "assistant" and rows[0]["messages"][-1]["content"]
    val = pq.read_table(tmp_path / "data" / "a1" / "validation.parquet").to_pylist()
    assert len(val) == 2 and (tmp_path / "rft_report.json").is_file()
    with pytest.raises(ValueError, match="kept no sample"):
        build_rft_data(
            SAMPLE,
            tmp_path / "x",
            "schema",
            cpu_executor.url,
            cpu_executor.served_model_name,
            reward_api.url,
            RftConfig(k=1, threshold=1.0, max_tokens=8),
            limit=1,
        )


@pytest.mark.service
def test_an_answer_cut_at_max_tokens_is_never_kept(reward_api: Any, tmp_path: Path) -> None:
    """A policy whose second prompt's answers all stop at the token limit: that prompt keeps nothing (a cut
    answer is no demonstration, whatever its reward), and the report counts them."""
    import json

    from shared import read_golden
    from tests.helpers.faulty_executor import FaultyExecutor

    schema = json.dumps(read_golden(SAMPLE / "common_train_schemas.jsonl", 1)[0].schema_dict())
    with FaultyExecutor(content=schema, length_share=0.5) as fx:  # request 2 of 2 ends with "length"
        rep = build_rft_data(SAMPLE, tmp_path, "schema", fx.url, fx.model, reward_api.url, RftConfig(k=2), limit=2)
    assert rep.samples == 4 and rep.truncated == 2 and rep.prompts_all_cut == 1 and rep.kept == 1
    assert json.loads((tmp_path / "rft_report.json").read_text())["truncated"] == 2


@pytest.mark.parametrize("flag", ["--reward", "--stage"])
def test_the_rft_command_names_a_bad_reward_kind(flag: str) -> None:
    """``--reward`` picks the reward kind; ``--stage``, its old spelling, still works."""
    from typer.testing import CliRunner

    from trainer.cli import app

    args = ["rft", "--golden", str(SAMPLE), "--policy-url", "http://p", "--policy-model", "m"]
    res = CliRunner().invoke(app, [*args, "--reward-url", "http://r", flag, "stage1"])
    text = " ".join(res.output.replace("│", " ").split())  # the error box wraps lines
    assert res.exit_code == 2 and "must be one of ['schema', 'table', 'pipeline']" in text


@pytest.mark.service
def test_rft_with_the_pipeline_reward_keeps_the_schemas_pi2_fills_well(tmp_path: Path) -> None:
    """π1's samples scored by the pipeline reward: a real reward API whose executor is π2 fills each
    schema, and only the samples whose table scores above the threshold are kept, as A1 data. π2 here
    answers the first document's gold table to every prompt, so only that document's schema earns it."""
    import json

    from shared import gold_ndjson, read_golden
    from tests.helpers.faulty_executor import FaultyExecutor
    from tests.helpers.servers import RewardApiServer

    first, second = read_golden(SAMPLE / "common_train_schemas.jsonl", 2)
    assert first.schema_dict()["columns"] != second.schema_dict()["columns"]
    schema = json.dumps(first.schema_dict())
    with (
        FaultyExecutor(content=schema) as pi1,
        FaultyExecutor(content=gold_ndjson(first.table_dict())) as pi2,
        RewardApiServer(env={"REWARD_API_EXECUTOR_URLS": pi2.url, "REWARD_API_EXECUTOR_MODEL": pi2.model}) as api,
    ):
        rep = build_rft_data(SAMPLE, tmp_path, "pipeline", pi1.url, pi1.model, api.url, RftConfig(k=2, threshold=0.5),
                             limit=2)  # fmt: skip
        stage2_calls = pi2.calls
    assert rep.reward == "pipeline" and rep.prompts == 2 and rep.samples == 4 and rep.kept == 1
    assert stage2_calls >= 1  # the pipeline reward asked π2 (identical samples share one call)
    rows = pq.read_table(tmp_path / "data" / "a1" / "train.parquet").to_pylist()
    assert len(rows) == 1 and rows[0]["messages"][-1]["content"] == schema
    assert first.text in rows[0]["messages"][1]["content"]
    assert json.loads((tmp_path / "rft_report.json").read_text())["reward"] == "pipeline"


def test_per_source_is_parsed_and_a_bad_part_is_named() -> None:
    from trainer.rft import parse_per_source

    assert parse_per_source("wikitabletext=2000, e2e=500") == {"wikitabletext": 2000, "e2e": 500}
    for bad, why in [
        ("e2e", "'e2e' is not SOURCE=N"),
        ("e2e=0", "'e2e=0'"),
        ("=3", "'=3'"),
        ("a=1,a=2", "named twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_per_source(bad)


def test_sample_per_source_draws_each_named_source_by_seed_in_file_order() -> None:
    from shared import read_golden
    from trainer.rft import sample_per_source

    examples = read_golden(SAMPLE / "common_train_schemas.jsonl")  # 4 invoice, 4 product, 4 people
    got = sample_per_source(examples, {"invoice": 2, "people": 9}, seed=3)
    ids = [ex.id for ex in got]
    assert sum(i.startswith("invoice-") for i in ids) == 2 and sum(i.startswith("people-") for i in ids) == 4
    assert not any(i.startswith("product-") for i in ids)  # a source left out is not sampled
    assert ids == sorted(ids, key=[ex.id for ex in examples].index)  # file order
    assert [ex.id for ex in sample_per_source(examples, {"invoice": 2, "people": 9}, seed=3)] == ids
    draws = {tuple(ex.id for ex in sample_per_source(examples, {"invoice": 2}, seed=s)) for s in range(8)}
    assert len(draws) > 1  # the seed picks which
    with pytest.raises(ValueError, match=r"no training example of \['rotowire'\]; the sources are"):
        sample_per_source(examples, {"rotowire": 1}, seed=0)


def test_the_rft_command_names_a_bad_per_source() -> None:
    from typer.testing import CliRunner

    from trainer.cli import app

    args = [
        "rft",
        "--golden",
        str(SAMPLE),
        "--policy-url",
        "http://p",
        "--policy-model",
        "m",
        "--reward-url",
        "http://r",
    ]
    res = CliRunner().invoke(app, [*args, "--per-source", "invoice=two"], env={"COLUMNS": "1000"})
    text = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "--per-source" in text and "'invoice=two' is not SOURCE=N" in text
    res = CliRunner().invoke(app, [*args, "--per-source", "rotowire=3"], env={"COLUMNS": "1000"})
    text = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 2 and "no training example of ['rotowire']" in text


@pytest.mark.service
def test_rft_reports_prompts_and_kept_per_source(reward_api: Any, tmp_path: Path) -> None:
    """--per-source through the real sample → score → keep path: the report counts per source what was drawn
    and what was kept."""
    import json

    from shared import read_golden
    from tests.helpers.faulty_executor import FaultyExecutor

    invoice = next(ex for ex in read_golden(SAMPLE / "common_train_schemas.jsonl") if ex.id.startswith("invoice-"))
    with FaultyExecutor(content=json.dumps(invoice.schema_dict())) as fx:
        cfg = RftConfig(k=2, threshold=0.99, concurrency=3, seed=1)
        rep = build_rft_data(SAMPLE, tmp_path, "schema", fx.url, fx.model, reward_api.url, cfg,
                             per_source={"invoice": 3, "people": 2})  # fmt: skip
    assert rep.prompts == 5 and rep.samples == 10
    assert rep.prompts_per_source == {"invoice": 3, "people": 2}
    # one invoice's own schema scores 1.0; every other document's gold differs from it
    assert rep.kept_per_source is not None and rep.kept_per_source.get("people", 0) == 0
    assert 1 <= rep.kept_per_source["invoice"] <= 3 and rep.kept == sum(rep.kept_per_source.values())
    saved = json.loads((tmp_path / "rft_report.json").read_text())
    assert saved["config"]["seed"] == 1 and saved["prompts_per_source"] == {"invoice": 3, "people": 2}


@pytest.mark.service
def test_beat_greedy_keeps_only_samples_above_the_greedy_answer_and_with_gold_adds_the_gold_rows(
    reward_api: Any, tmp_path: Path
) -> None:
    """The samples are the first invoice's own gold schema; the greedy answer is a people schema. Under
    --beat-greedy an invoice's sample (schema reward 1.0 where the invoices share the gold) beats greedy and is
    kept, a people document's sample is kept only where it beats its greedy people schema; when greedy writes
    the same as the samples, nothing beats it and the error says so. --with-gold adds one gold row per prompt."""
    import json

    from shared import read_golden
    from tests.helpers.faulty_executor import FaultyExecutor

    examples = read_golden(SAMPLE / "common_train_schemas.jsonl")
    invoice = next(ex for ex in examples if ex.id.startswith("invoice-"))
    people = next(ex for ex in examples if ex.id.startswith("people-"))
    sample, greedy = json.dumps(invoice.schema_dict()), json.dumps(people.schema_dict())
    picks = {"invoice": 2, "people": 2}
    cfg = RftConfig(k=2, threshold=0.0, beat_greedy=True, with_gold=True)
    with FaultyExecutor(content=sample, greedy_content=greedy) as fx:
        rep = build_rft_data(SAMPLE, tmp_path, "schema", fx.url, fx.model, reward_api.url, cfg, per_source=picks)
        greedy_calls = sum(1 for r in fx.requests if not float(r.get("temperature") or 0.0))
    assert greedy_calls == 4  # one greedy answer per prompt
    assert rep.kept_per_source is not None and rep.kept_per_source.get("invoice") == 2
    assert rep.kept_per_source.get("people", 0) == 0 and rep.not_above_greedy == 2
    greedy_means = rep.mean_greedy_reward_per_source or {}
    assert greedy_means["people"] > greedy_means["invoice"]
    rows = pq.read_table(tmp_path / "data" / "a1" / "train.parquet").to_pylist()
    assert rep.gold_rows == 4 and len(rows) == rep.kept + 4
    rft_ids = [r["id"] for r in rows if r["id"].endswith("#rft")]
    gold_ids = [r["id"] for r in rows if not r["id"].endswith("#rft")]
    assert len(rft_ids) == 2 and all(i.startswith("invoice-") for i in rft_ids)
    assert sorted(i.split("-")[0] for i in gold_ids) == ["invoice", "invoice", "people", "people"]
    same = RftConfig(k=2, threshold=0.0, beat_greedy=True)
    with (
        FaultyExecutor(content=sample, greedy_content=sample) as fx,
        pytest.raises(ValueError, match="without beating"),
    ):
        build_rft_data(SAMPLE, tmp_path / "same", "schema", fx.url, fx.model, reward_api.url, same, per_source=picks)

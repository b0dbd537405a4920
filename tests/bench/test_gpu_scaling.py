"""The GPU scale-out bench without a GPU: its plan, the settings and commands it builds, the metrics it
reads from vLLM's /metrics, and the report it writes from recorded rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common
from bench import gpu_scaling as gs
from shared import read_split

GOLDEN = Path(__file__).resolve().parents[3] / "shared" / "data" / "golden"

VLLM_METRICS = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 30.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 12.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 5000.0
"""


def test_plan_covers_every_pair_replicas_first() -> None:
    got = [(c.replicas, c.workers) for c in gs.plan([4, 1, 2], [8, 1], n_urls=4)]
    assert got == [(1, 1), (1, 8), (2, 1), (2, 8), (4, 1), (4, 8)]


def test_plan_refuses_more_replicas_than_urls() -> None:
    with pytest.raises(ValueError, match=r"--replicas \[4\]: only 2 executor URL"):
        gs.plan([1, 2, 4], [1], n_urls=2)
    with pytest.raises(ValueError, match="--workers"):
        gs.plan([1], [0], n_urls=1)


def test_reward_api_env_lists_the_urls_and_turns_the_cache_off() -> None:
    from trainer.serving.reward_api_env import reward_api_env

    env = reward_api_env(**gs.reward_api_settings(["http://127.0.0.1:1/", "http://127.0.0.1:2"], "m", 160, 256))
    assert env["REWARD_API_EXECUTOR_URLS"] == "http://127.0.0.1:1,http://127.0.0.1:2"
    assert env["REWARD_API_CACHE_SIZE"] == "0"
    assert env["REWARD_API_MAX_TOKENS"] == "160" and env["REWARD_API_MAX_IN_FLIGHT"] == "256"


def test_metric_sum_adds_every_label_set_and_skips_created() -> None:
    assert gs.metric_sum(VLLM_METRICS, gs.VLLM_DONE) == 42.0
    assert gs.metric_sum(VLLM_METRICS, gs.VLLM_GEN_TOKENS) == 5000.0
    assert gs.metric_sum(VLLM_METRICS, "vllm:absent_total") == 0.0


def test_shares_are_per_replica_deltas() -> None:
    before = [{"done": 10.0, "gen_tokens": 0.0}, {"done": 0.0, "gen_tokens": 0.0}]
    after = [{"done": 70.0, "gen_tokens": 0.0}, {"done": 20.0, "gen_tokens": 0.0}]
    assert gs.shares(before, after) == [0.75, 0.25]
    assert gs.shares(before, before) == [0.0, 0.0]


@pytest.mark.skipif(not (GOLDEN / "common_test_schemas.jsonl").is_file(), reason="golden data not beside the repo")
def test_items_are_distinct_documents_with_the_gold_schema_as_prediction() -> None:
    examples = read_split(GOLDEN, "test", limit=300)
    items = gs.build_items(examples, 200)
    assert len({it["text"] for it in items}) == 200
    first = items[0]
    assert json.loads(first["prediction"]) == json.loads(gs.canonical_schema_json(first["gold_schema"]))
    with pytest.raises(ValueError, match="distinct documents"):
        gs.build_items(examples[:5], 10)


def test_max_tokens_follows_the_gold_lengths() -> None:
    table = {"columns": [{"name": "a"}], "data": [["x" * 341]]}  # {"a": "x…x"} is 350 characters
    items = [{"gold_table": table}] * 10
    # ~100 tokens at 3.5 chars each, +25%, rounded up to 16
    assert gs.realistic_max_tokens(items) == 128
    assert gs.realistic_max_tokens(items, count_tokens=lambda s: 200) == 256


ROWS = [
    {"replicas": 1, "workers": 1, "items_per_s": 100.0},
    {"replicas": 1, "workers": 8, "items_per_s": 110.0},
    {"replicas": 2, "workers": 1, "items_per_s": 150.0},
    {"replicas": 2, "workers": 8, "items_per_s": 210.0},
    {"replicas": 4, "workers": 1, "items_per_s": 160.0},
    {"replicas": 4, "workers": 8, "items_per_s": 360.0},
]


def test_goals_compare_best_rates_against_one_replica() -> None:
    best, goals = gs.goals_from(ROWS)
    assert best == {1: 110.0, 2: 210.0, 4: 360.0}
    by = {g["target"]: g for g in goals}
    assert by[1.8]["value"] == round(210 / 110, 2) and by[1.8]["met"]
    assert by[3.4]["value"] == round(360 / 110, 2) and not by[3.4]["met"]


def test_bottleneck_note_names_reward_api_when_workers_help() -> None:
    note = gs.bottleneck_note(ROWS)
    four = "4 executor(s): best at 8 worker(s) in all (reward_api 1 × 8), 2.25× the rate with 1 (1 × 1)"
    one = "1 executor(s): best at 8 worker(s) in all (reward_api 1 × 8), 1.10× the rate with 1 (1 × 1)"
    assert f"{four}: the limit is reward_api" in note and f"{one}: the limit is the executors" in note


def test_report_writes_json_md_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gs, "write_result", _writer(tmp_path))
    import bench.common

    monkeypatch.setattr(bench.common, "RESULTS_DIR", tmp_path)
    rows = [
        {
            **r,
            "items": 2000,
            "seconds": 2000 / r["items_per_s"],
            "executor_tokens_per_s": 10 * r["items_per_s"],
            "generated_tokens_per_item": 10.0,
            "executor_requests": 2000,
            "p50_ms": 100.0,
            "p99_ms": 300.0,
            "mean_ms": 120.0,
            "failed": 0,
            "share_per_replica": [round(1 / r["replicas"], 4)] * r["replicas"],
        }
        for r in ROWS
    ]
    record = gs.run_record(quick=True)
    setup = {"model": "m", "items": 2000, "max_tokens": 160, "clients": 16, "batch": 32, "max_in_flight": 256}
    payload = gs.report(rows, record, {**setup, "gpu": {"count": 4, "name": "H100"}}, quick=True)
    assert [g["met"] for g in payload["goals"]] == [True, False]
    md = (tmp_path / "gpu_scaling.quick.md").read_text()
    assert "| items/s at 2 executors ≥ 1.8× 1 executor | 1.91 | 1.8 | met |" in md
    assert "| items/s at 4 executors ≥ 3.4× 1 executor | 3.27 | 3.4 | NOT met |" in md
    assert "0.25 / 0.25 / 0.25 / 0.25" in md and "4 × H100" in md
    assert (tmp_path / "gpu_scaling.quick.png").stat().st_size > 1000


def _writer(folder: Path):  # type: ignore[no-untyped-def]
    def write(name: str, payload: dict, markdown: str, quick: bool) -> tuple[Path, Path]:  # type: ignore[type-arg]
        stem = f"{name}.quick" if quick else name
        (folder / f"{stem}.json").write_text(json.dumps(payload))
        (folder / f"{stem}.md").write_text(markdown)
        return folder / f"{stem}.json", folder / f"{stem}.md"

    return write


def test_default_replicas_double_up_to_the_executors_there_are() -> None:
    assert gs.default_replicas(1) == [1] and gs.default_replicas(2) == [1, 2]
    assert gs.default_replicas(3) == [1, 2] and gs.default_replicas(4) == [1, 2, 4]


def test_served_executors_one_per_gpu_with_cuda_graphs_and_stopped_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--serve-model: one executor per GPU through trainer.serving (the loop's executors), no prefix cache."""
    import contextlib

    from trainer.serving import executors
    from trainer.serving.endpoint import Endpoint

    asked: dict[str, object] = {}

    @contextlib.contextmanager
    def serve_replicas(model: str, logs: list[Path], slots: list[object], **kw: object):  # type: ignore[no-untyped-def]
        asked.update(model=model, logs=logs, slots=slots, **kw)
        yield [Endpoint(f"http://127.0.0.1:{9000 + i}", str(kw["served_name"])) for i in range(len(slots))]
        asked["stopped"] = True

    monkeypatch.setattr(executors, "serve_replicas", serve_replicas)
    with common.gpu_executor_urls([], "/m", "2,3", "smol", 0.3, prefix_caching=False) as urls:
        assert urls == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"] and "stopped" not in asked
    assert asked["stopped"] and asked["model"] == "/m" and asked["eager"] is False
    assert asked["prefix_caching"] is False and asked["served_name"] == "smol"
    assert [(s.gpus, s.memory) for s in asked["slots"]] == [(("2",), 0.3), (("3",), 0.3)]  # type: ignore[attr-defined]
    with common.gpu_executor_urls(["http://h:1/"], None, None, "smol", 0.3, True) as urls:
        assert urls == ["http://h:1"]  # running executors: used as they are
    for urls_, model in (([], None), (["http://h:1"], "/m")):
        with (
            pytest.raises(ValueError, match=r"--executor-url .* or --serve-model"),
            common.gpu_executor_urls(urls_, model, None, "smol", 0.3, True),
        ):
            pytest.fail("must not yield")


def test_plan_with_reward_api_replicas() -> None:
    got = [(c.replicas, c.api_replicas, c.workers) for c in gs.plan([2, 1], [16, 8], n_urls=2, api_replicas=[2, 1])]
    assert got == [(1, 1, 8), (1, 1, 16), (1, 2, 8), (1, 2, 16), (2, 1, 8), (2, 1, 16), (2, 2, 8), (2, 2, 16)]
    assert gs.Config(4, 16, 2).label == "4 exec × 2 reward_api × 16 workers"
    assert gs.Config(4, 16).label == "4 exec × 16 workers"
    with pytest.raises(ValueError, match="--api-replicas"):
        gs.plan([1], [1], n_urls=1, api_replicas=[0])


def test_clients_spread_round_robin_over_reward_api_replicas() -> None:
    assert gs.client_urls("http://a", 3) == ["http://a"] * 3
    assert gs.client_urls(["http://a", "http://b"], 5) == ["http://a", "http://b", "http://a", "http://b", "http://a"]
    with pytest.raises(ValueError):
        gs.client_urls([], 2)


def test_bottleneck_note_counts_workers_over_reward_api_replicas() -> None:
    rows = [
        {"replicas": 4, "workers": 8, "api_replicas": 1, "items_per_s": 400.0},
        {"replicas": 4, "workers": 8, "api_replicas": 2, "items_per_s": 700.0},
    ]
    note = gs.bottleneck_note(rows)
    assert "4 executor(s): best at 16 worker(s) in all (reward_api 2 × 8), 1.75× the rate with 8 (1 × 8)" in note
    assert "the limit is reward_api" in note


def test_same_setting_speedups_pair_rows_by_reward_api_setting(tmp_path: Path) -> None:
    rows = [
        {"replicas": 1, "workers": 4, "api_replicas": 1, "items_per_s": 200.0},
        {"replicas": 1, "workers": 4, "api_replicas": 2, "items_per_s": 250.0},
        {"replicas": 2, "workers": 4, "api_replicas": 1, "items_per_s": 380.0},
        {"replicas": 2, "workers": 4, "api_replicas": 2, "items_per_s": 500.0},
        {"replicas": 2, "workers": 8, "api_replicas": 1, "items_per_s": 420.0},  # no 1-executor row: left out
    ]
    rest = {"executor_tokens_per_s": 1.0, "generated_tokens_per_item": 128.0, "p50_ms": 1.0, "p99_ms": 2.0,
            "failed": 0, "share_per_replica": [1.0]}  # fmt: skip
    rows = [r | rest for r in rows]
    got = gs.same_setting_speedups(rows)
    assert got == [
        {"executors": 2, "reward_api": "1 × 4", "speedup": 1.9},
        {"executors": 2, "reward_api": "2 × 4", "speedup": 2.0},
    ]
    # the goal compares best against best: 500 / 250
    assert gs.goals_from(rows)[1][0]["value"] == 2.0
    run = {"quick": False, "noisy": False, "timestamp": "t", "command": "c", "loadavg_1m_at_start": 1.0,
           "machine": {"cpu": "x", "cores": 32, "ram_gib": 251.8},
           "versions": {"python": "3.12", "vllm": "0.24.0", "fastapi": "f", "uvicorn": "u", "project_commit": "c"}}
    rec = {"run": run, "model": "m",
           "items": 2000, "max_tokens": 128, "clients": 32, "batch": 16, "max_in_flight": 256,
           "gpu": {"count": 2, "name": "H200"}, "rows": rows}  # fmt: skip
    path = tmp_path / "old.json"
    path.write_text(json.dumps(rec))  # a result recorded before the same-setting section existed
    md = gs.rerender(path)
    assert "## Speed-up at the same reward_api setting" in md
    assert "| 2 | 2 × 4 | 2 |" in md and "| 2 | 1 × 4 | 1.9 |" in md
    assert "| items/s at 2 executors ≥ 1.8× 1 executor | 2 | 1.8 | met |" in md


def test_load_spreads_over_two_real_reward_api_replicas() -> None:
    """Two real reward_api processes (uvicorn) over one fault-injecting executor that answers every call:
    the load generator's clients reach both, and every item comes back scored."""
    import asyncio

    from shared import gold_ndjson
    from tests.helpers.faulty_executor import FaultyExecutor
    from trainer.serving.reward_api import reward_api_process

    items = gs.build_items(read_split(GOLDEN, "test"), 12)
    with FaultyExecutor("ok", content=gold_ndjson(items[0]["gold_table"])) as fx:
        settings = gs.reward_api_settings([fx.url], fx.model, 16, 8)
        with reward_api_process(None, **settings) as a, reward_api_process(None, **settings) as b:
            seconds, latencies, failed = asyncio.run(gs._load([a.url, b.url], items, clients=4, batch=3))
            served = [gs.metric_sum(api.metrics_text(), "reward_api_items_total") for api in (a, b)]
    assert failed == 0 and len(latencies) == 4 and seconds > 0
    assert served == [6.0, 6.0]
    assert fx.calls == 12


def test_the_command_serves_the_model_and_measures_up_to_every_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m bench gpu-scaling --serve-model DIR --gpus 0,1,2,3`: what scaling.sh did, in one command."""
    import contextlib

    from typer.testing import CliRunner

    from bench.__main__ import app

    seen: dict[str, object] = {}

    @contextlib.contextmanager
    def served(urls: list[str], model: str | None, gpus: str | None, name: str, memory: float, prefix_caching: bool):  # type: ignore[no-untyped-def]
        seen.update(urls=urls, model=model, gpus=gpus, name=name, memory=memory, prefix=prefix_caching)
        yield [f"http://127.0.0.1:{9000 + i}" for i in range(len((gpus or "").split(",")))]

    def run(urls: list[str], model: str, golden: object, replicas: list[int], *rest: object) -> dict[str, object]:
        seen.update(run_urls=urls, replicas=replicas, tokenizer=rest[6])
        return {"benchmark": "gpu_scaling", "goals": []}

    monkeypatch.setattr(common, "gpu_executor_urls", served)
    monkeypatch.setattr(gs, "run", run)
    result = CliRunner().invoke(app, ["gpu-scaling", "--serve-model", "/m", "--gpus", "0,1,2", "--clients", "32"])
    assert result.exit_code == 0, result.output
    assert seen["urls"] == [] and seen["model"] == "/m" and seen["gpus"] == "0,1,2" and seen["prefix"] is False
    assert seen["replicas"] == [1, 2] and len(seen["run_urls"]) == 3  # type: ignore[arg-type]
    assert seen["tokenizer"] == "/m"  # gold tokens counted with the served model's tokenizer

"""Our reward function driven by VERL 0.9's own reward path against a live reward_api.

``RewardLoopWorker(cfg).compute_score_batch(data)`` is the production worker class; the config is
VERL's ``ppo_trainer`` with our ``reward.*`` overrides; the DataProto is shaped like rollout output.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared import (
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    gold_ndjson,
    golden_filename,
    pipeline_reward_for_invalid_schema,
    read_golden,
)
from tests.helpers.servers import RewardApiServer
from tests.trainer.in_verl.verl_harness import (
    REWARD_FN,
    compose_ppo_config,
    reward_overrides,
    rollout_dataproto,
    run_reward_worker,
)
from trainer.data.sample_data import SAMPLE_DIR
from trainer.in_verl.reward_batcher import SCORE_KEYS
from trainer.phase_rules.failure_mask import FAILURE_CAUSES

# medium_lane: VERL's reward loop in Ray and at most one vLLM-CPU executor, 4.8 GiB at the peak measured alone
pytestmark = [pytest.mark.verl, pytest.mark.service, pytest.mark.slow, pytest.mark.medium_lane]
VAL = read_golden(SAMPLE_DIR / golden_filename("validation"))


def reward_requests(url: str, endpoint: str) -> float:
    """Requests the reward API has answered on ``endpoint`` (from its Prometheus /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "reward_api_requests_total" and s.labels.get("endpoint") == f"/reward/{endpoint}":
                total += s.value
    return total


@pytest.fixture(scope="module")
def reward_api() -> Iterator[RewardApiServer]:
    with RewardApiServer() as api:
        yield api


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _schema_responses(ex: Any) -> list[str]:
    names = ex.schema_.names()
    return [canonical_schema_json(ex.schema_dict()), json.dumps({"columns": [{"name": names[0]}, {"name": "extra"}]}),
            "I think the table has a name column."]


def _table_responses(ex: Any) -> list[str]:
    rows = gold_ndjson(ex.table_dict()).splitlines()
    return ["\n".join(rows), rows[0], "name: value"]


def test_verl_reward_loop_calls_our_function_in_batches(
    reward_api: RewardApiServer, default_model_dir: Path, tokenizer: Any
) -> None:
    samples: list[dict[str, Any]] = []
    expected: list[dict[str, float]] = []
    for ex in VAL:
        for resp in _schema_responses(ex):
            samples.append({"prompt": build_stage1_messages(ex.text), "response": resp, "data_source": "schema",
                            "ground_truth": json.dumps({"schema": ex.schema_dict()}), "extra_info": {"id": ex.id}})
            r = compute_schema_reward_single(resp, ex.schema_dict())
            expected.append({"score": r.reward, "valid_json": float(r.valid_json), "precision": r.precision,
                             "recall": r.recall, "f1": r.f1})
        for resp in _table_responses(ex):
            samples.append({"prompt": build_stage2_messages(ex.text, ex.schema_dict()), "response": resp,
                            "data_source": "table", "ground_truth": json.dumps({"table": ex.table_dict()}),
                            "extra_info": {"id": ex.id}})
            t = compute_table_reward_single(resp, ex.table_dict())
            expected.append({"score": t.reward, "valid_json": float(t.valid_json), "table_score": t.score,
                             "cell_accuracy": t.cell_accuracy})  # fmt: skip
    cfg = compose_ppo_config(default_model_dir, reward_overrides(reward_api.url, max_batch=8, max_wait_ms=200))
    before = {e: reward_requests(reward_api.url, e) for e in ("schema", "table")}
    out = run_reward_worker(cfg, rollout_dataproto(tokenizer, samples))
    made = {e: reward_requests(reward_api.url, e) - before[e] for e in ("schema", "table")}

    assert len(out) == len(samples) == 36
    for s, o, want in zip(samples, out, expected, strict=True):
        assert o["reward_score"] == pytest.approx(want["score"])
        assert list(o["reward_extra_info"]) == list(SCORE_KEYS[s["data_source"]])
        assert o["reward_extra_info"] == pytest.approx({**want, **dict.fromkeys(("masked", *FAILURE_CAUSES), 0.0)})
    assert {o["reward_score"] for o in out} >= {1.0, -1.0}  # real spread, not a constant
    # 18 samples per endpoint, max_batch 8: at least 3 POSTs each, and far fewer than 36 in all
    assert made["schema"] >= 3 and made["table"] >= 3
    assert made["schema"] + made["table"] <= 9, made


def test_reward_keys_are_the_ones_verl_uses(default_model_dir: Path) -> None:
    """Under ``reward.*`` VERL loads our file; the old top-level key is not what the worker uses."""
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.utils.reward_score import default_compute_score

    ours = RewardLoopWorker(compose_ppo_config(default_model_dir, reward_overrides("http://127.0.0.1:9")))
    fn: Any = ours.reward_manager.compute_score  # functools.partial(VERL's kwargs wrapper, our fn, reward_kwargs)
    assert fn.args[0].__code__.co_filename == str(REWARD_FN) and fn.args[0].__name__ == "compute_score"
    assert fn.args[1] == {"url": "http://127.0.0.1:9"}
    legacy = compose_ppo_config(
        default_model_dir, [f"custom_reward_function.path={REWARD_FN}", "custom_reward_function.name=compute_score"]
    )
    assert legacy.reward.custom_reward_function.path is None
    assert RewardLoopWorker(legacy).reward_manager.compute_score is default_compute_score


@pytest.mark.vllm
def test_pipeline_scores_through_verl_and_live_executor(
    cpu_executor: Any, default_model_dir: Path, tokenizer: Any
) -> None:
    env = {"REWARD_API_EXECUTOR_URLS": cpu_executor.url, "REWARD_API_EXECUTOR_MODEL": cpu_executor.served_model_name,
           # generous deadlines: the shared 2-core machine can drop to ~1 token/s
           "REWARD_API_MAX_TOKENS": "32", "REWARD_API_EXECUTOR_TIMEOUT_S": "600",
           "REWARD_API_REQUEST_DEADLINE_S": "900"}
    examples = VAL[:3]
    samples, preds = [], []
    for ex in examples:
        gt = json.dumps({"schema": ex.schema_dict(), "table": ex.table_dict(), "text": ex.text})
        # GRPO-style duplicates: each valid schema twice, plus one invalid schema
        for resp in (canonical_schema_json(ex.schema_dict()),) * 2 + ("no schema here",):
            samples.append({"prompt": build_stage1_messages(ex.text), "response": resp, "data_source": "pipeline",
                            "ground_truth": gt, "extra_info": {"id": ex.id}})
            preds.append((ex, resp))
    with RewardApiServer(env) as api:
        cfg = compose_ppo_config(default_model_dir, reward_overrides(api.url, max_batch=16, max_wait_ms=300,
                                                                     timeout_s=1200))
        before = reward_requests(api.url, "pipeline")
        out = run_reward_worker(cfg, rollout_dataproto(tokenizer, samples))
        made = reward_requests(api.url, "pipeline") - before
        # the executor outputs behind those rewards, to recompute them with shared directly
        body = {"items": [{"id": str(i), "prediction": r, "text": ex.text, "gold_schema": ex.schema_dict(),
                           "gold_table": ex.table_dict()} for i, (ex, r) in enumerate(preds)], "debug": True}
        debug = httpx.post(f"{api.url}/reward/pipeline", json=body, timeout=600).json()["results"]
    assert made == 1  # nine samples, one POST
    for (ex, resp), o, d in zip(preds, out, debug, strict=True):
        assert list(o["reward_extra_info"]) == list(SCORE_KEYS["pipeline"])
        s = compute_schema_reward_single(resp, ex.schema_dict())
        if s.valid_json:
            table = compute_table_reward_single(d["debug"]["executor_output"], ex.table_dict())
            want = combine_pipeline_reward(s, table)
        else:
            want = pipeline_reward_for_invalid_schema(s, ex.table_dict())
        assert o["reward_score"] == pytest.approx(want.reward)
        assert o["reward_extra_info"]["cell_accuracy"] == pytest.approx(want.table.cell_accuracy)
        assert o["reward_extra_info"]["executor_failed"] == 0.0
    assert [o["reward_score"] for o in out[2::3]] == [-1.0] * 3

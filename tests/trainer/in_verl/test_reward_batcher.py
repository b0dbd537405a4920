"""The reward client's batching, deadline and retry policy, against a fault-injecting server."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared import compute_schema_reward_single
from tests.helpers.faulty_reward_api import FaultInjectingRewardApi
from tests.trainer.in_verl.faulty_reward_api import Faults, FaultyRewardApi
from trainer.in_verl import reward_batcher
from trainer.in_verl.reward_batcher import (
    FAILURE_CAUSES,
    SCORE_KEYS,
    TOKEN_ENV,
    URL_ENV,
    ImpossibleRewardError,
    RewardClientConfig,
    RewardRanges,
    RewardRequestError,
    RewardServiceError,
    RewardTimeoutError,
    batchers_of_running_loop,
    build_item,
    client_config_from_kwargs,
    decode_ground_truth,
    masked_score,
    score_dict,
    score_one,
)
from trainer.in_verl.reward_fn import compute_score

GOLD = {"schema": {"columns": [{"name": "name"}, {"name": "area"}, {"name": "price_range"}]}}
PREDS = [
    '{"columns": [{"name": "name"}, {"name": "area"}]}',
    '["name", "area", "price_range"]',
    "not json",
    '```json\n{"fields": [{"name": "Name"}, {"name": "food"}]}\n```',
]

# the parts of a sample that is no failure: no mask, no cause
NO_FAILURE = dict.fromkeys(("masked", *FAILURE_CAUSES), 0.0)


async def _close() -> None:
    for b in batchers_of_running_loop():
        await b.aclose()


def _cfg(url: str, **kw: object) -> RewardClientConfig:
    return RewardClientConfig.model_validate({"url": url, "backoff_s": 0.01, **kw})


async def test_concurrent_calls_are_coalesced_into_few_posts() -> None:
    with FaultyRewardApi() as api:
        cfg = _cfg(api.url, max_batch=16, max_wait_ms=50)
        preds = [PREDS[i % len(PREDS)] for i in range(50)]
        try:
            scores = await asyncio.gather(*(score_one("schema", p, GOLD, cfg, f"s{i}") for i, p in enumerate(preds)))
        finally:
            await _close()
    assert api.faults.requests == 4
    assert sorted(api.faults.batch_sizes) == [2, 16, 16, 16]
    for p, s in zip(preds, scores, strict=True):
        want = compute_schema_reward_single(p, GOLD["schema"])
        assert s == {
            "score": want.reward,
            "valid_json": float(want.valid_json),
            "precision": want.precision,
            "recall": want.recall,
            "f1": want.f1,
            **NO_FAILURE,
        }


async def test_503_is_retried_then_succeeds() -> None:
    with FaultyRewardApi(Faults(fail_first=2, status=503)) as api:
        try:
            s = await score_one("schema", PREDS[1], GOLD, _cfg(api.url, max_attempts=4))
        finally:
            await _close()
    assert api.faults.requests == 3
    assert s["score"] == 1.0


async def test_503_raises_after_all_attempts_never_a_score() -> None:
    with FaultyRewardApi(Faults(fail_first=1000, status=503)) as api:
        try:
            with pytest.raises(RewardServiceError, match=r"HTTP 503 after 3 attempt\(s\)"):
                await score_one("schema", PREDS[0], GOLD, _cfg(api.url, max_attempts=3))
        finally:
            await _close()
    assert api.faults.requests == 3


async def test_executor_503_is_not_retried_by_the_client() -> None:
    """The service retries its executor calls; retrying its executor 503 again multiplied the
    executor attempts (3 service tries × 4 client tries = 12 per sample). One layer retries."""
    faults = Faults(fail_first=1000, status=503, error="executor_unavailable")
    with FaultyRewardApi(faults) as api:
        try:
            with pytest.raises(RewardServiceError, match=r"HTTP 503 after 1 attempt\(s\).*executor_unavailable"):
                await score_one("schema", PREDS[0], GOLD, _cfg(api.url, max_attempts=4))
        finally:
            await _close()
    assert api.faults.requests == 1


async def test_429_is_retried_but_400_is_not() -> None:
    with FaultyRewardApi(Faults(fail_first=1, status=429)) as api:
        try:
            assert (await score_one("schema", PREDS[1], GOLD, _cfg(api.url)))["score"] == 1.0
        finally:
            await _close()
    assert api.faults.requests == 2
    with FaultyRewardApi(Faults(fail_first=1000, status=400)) as api:
        try:
            with pytest.raises(RewardServiceError, match="HTTP 400"):
                await score_one("schema", PREDS[1], GOLD, _cfg(api.url, max_attempts=5))
        finally:
            await _close()
    assert api.faults.requests == 1


async def test_deadline_raises_timeout_for_every_waiter() -> None:
    with FaultyRewardApi(Faults(delay_s=3.0)) as api:
        cfg = _cfg(api.url, timeout_s=0.5, max_attempts=1)
        t0 = time.monotonic()
        try:
            results = await asyncio.gather(*(score_one("schema", p, GOLD, cfg) for p in PREDS), return_exceptions=True)
        finally:
            await _close()
        elapsed = time.monotonic() - t0
    assert all(isinstance(r, RewardTimeoutError) for r in results), results
    assert elapsed < 2.0


async def test_connection_refused_raises_after_retries() -> None:
    from tests.helpers.faulty_executor import closed_port

    with closed_port() as port:
        cfg = _cfg(f"http://127.0.0.1:{port}", max_attempts=2, timeout_s=10)
        try:
            with pytest.raises(RewardServiceError, match="ConnectError after 2 attempts"):
                await score_one("schema", PREDS[0], GOLD, cfg)
        finally:
            await _close()


async def test_compute_score_reads_kwargs_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with FaultyRewardApi() as api:
        monkeypatch.setenv(URL_ENV, api.url)  # what the launcher hands VERL's reward workers
        try:
            s = await compute_score("schema", PREDS[0], '{"schema": {"columns": [{"name": "name"}]}}', {"id": "x"})
        finally:
            await _close()
    assert s == {
        "score": pytest.approx(2 / 3),
        "valid_json": 1.0,
        "precision": 0.5,
        "recall": 1.0,
        "f1": pytest.approx(2 / 3),
        **NO_FAILURE,
    }


async def test_mask_mode_turns_a_failed_reward_call_into_a_masked_sample(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reward service that answers 503 after every retry: in mask mode the sample is masked
    (``reward_call_failed``) and the failure log names the error; a 400 (our request is wrong) and any failure
    in penalize mode still raise."""
    log = tmp_path / "reward_failures.jsonl"
    truth = '{"schema": {"columns": [{"name": "name"}]}}'
    with FaultyRewardApi(Faults(fail_first=1000, status=503)) as api:
        monkeypatch.setenv(URL_ENV, api.url)
        try:
            kw = {"max_attempts": 2, "backoff_s": 0, "failure_log": str(log)}
            s = await compute_score("schema", PREDS[0], truth, {"id": "doc-1"}, **kw)
            assert s == masked_score("schema", "reward_call_failed") and s["masked"] == 1.0 and s["score"] == 0.0
            with pytest.raises(RewardServiceError, match="HTTP 503"):
                await compute_score("schema", PREDS[0], truth, {"id": "doc-2"}, **kw, failure_mode="penalize")
        finally:
            await _close()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["doc-1", "doc-2"] and all("HTTP 503" in x["error"] for x in lines)
    with FaultyRewardApi(Faults(fail_first=1000, status=400)) as api:
        monkeypatch.setenv(URL_ENV, api.url)
        try:
            with pytest.raises(RewardRequestError, match="HTTP 400"):
                await compute_score("schema", PREDS[0], truth, {"id": "doc-3"})
        finally:
            await _close()


def test_config_errors_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.setenv("REWARD_API_URL", "http://user")  # the user's variable reaches VERL only via the launcher
    with pytest.raises(ValueError, match=r"reward_kwargs\.url or TRAINER_REWARD_URL"):
        client_config_from_kwargs({})
    monkeypatch.setenv(URL_ENV, "http://launcher")
    monkeypatch.setenv(TOKEN_ENV, "secret")
    cfg = client_config_from_kwargs({})
    assert cfg.url == "http://launcher" and cfg.token is not None and cfg.token.get_secret_value() == "secret"
    assert "secret" not in repr(cfg) and "secret" not in str(cfg.model_dump())  # printed or logged, it stays hidden
    # a token in the config would land in command.sh, phase_result.json and VERL's config log: refused by name
    with pytest.raises(ValueError, match=r"reward_kwargs\.token: the reward API token comes from the environment"):
        client_config_from_kwargs({"url": "http://x", "token": "t"})
    unset = client_config_from_kwargs({"url": "http://x", "token": None}).token  # an empty key is no token
    assert unset is not None and unset.get_secret_value() == "secret"
    with pytest.raises(ValueError, match=r"reward_kwargs\.max_batchh"):
        client_config_from_kwargs({"url": "http://x", "max_batchh": 3})
    with pytest.raises(ValueError, match=r"reward_kwargs\.max_batch"):
        client_config_from_kwargs({"url": "http://x", "max_batch": 0})
    cfg = client_config_from_kwargs(
        {"url": "http://x", "timeout": 5, "pipeline_config": '{"schema_weight": 0.7}', "reward_router_address": None}
    )
    assert cfg.timeout_s == 5 and cfg.pipeline_config == {"schema_weight": 0.7}


def test_items_and_ground_truth_errors() -> None:
    gt = decode_ground_truth('{"schema": {"columns": []}, "table": {"columns": [], "data": []}, "text": "t"}')
    assert build_item("pipeline", "i", "p", gt) == {
        "id": "i",
        "prediction": "p",
        "text": "t",
        "gold_schema": gt["schema"],
        "gold_table": gt["table"],
    }
    with pytest.raises(ValueError, match="lacks field 'table'"):
        build_item("table", "i", "p", {"schema": {}})
    with pytest.raises(ValueError, match="data_source must be one of"):
        build_item("math", "i", "p", gt)
    with pytest.raises(ValueError, match="must be a JSON object"):
        decode_ground_truth("[1, 2]")


def test_score_keys_do_not_depend_on_the_result() -> None:
    ok = {
        "reward": 0.5,
        "valid_json": True,
        "schema_reward": 1,
        "table_reward": 0,
        "f1": 1,
        "cell_accuracy": 0.5,
        "precision": 1,
        "recall": 1,
        "error": None,
        "score": 0.75,
        "table_score": 0.75,
    }
    bad = {**ok, "valid_json": False, "error": "executor_failed"}
    for source in SCORE_KEYS:
        for mode in ("mask", "penalize"):
            keys = [list(score_dict(source, r, mode)) for r in (ok, bad)]  # type: ignore[arg-type]
            assert keys[0] == keys[1] == list(SCORE_KEYS[source])
        assert list(masked_score(source, "reward_call_failed")) == list(SCORE_KEYS[source])
    assert score_dict("pipeline", bad, "penalize")["executor_failed"] == 1.0
    assert score_dict("pipeline", bad, "penalize")["masked"] == 0.0
    assert score_dict("pipeline", ok)["executor_failed"] == score_dict("pipeline", ok)["masked"] == 0.0


@pytest.mark.parametrize("cause", ["executor_failed", "executor_truncated", "prompt_too_long"])
def test_mask_mode_turns_an_infrastructure_failure_into_a_masked_sample(cause: str) -> None:
    """The service's per-item failure is the sample's mask and cause, with score 0 and no metric of its own; in
    penalize mode the same answer is the service's penalty, trained on."""
    answer = {"reward": -0.3, "valid_json": True, "schema_reward": 0.4, "table_reward": -1.0, "f1": 0.4,
              "cell_accuracy": 0.0, "table_score": 0.0, "error": cause}  # fmt: skip
    masked = score_dict("pipeline", answer)
    assert masked["masked"] == 1.0 and masked[cause] == 1.0 and masked["score"] == 0.0
    assert sum(masked[c] for c in FAILURE_CAUSES) == 1.0 and masked["schema_reward"] == 0.0
    penalized = score_dict("pipeline", answer, "penalize")
    assert penalized["masked"] == 0.0 and penalized[cause] == 1.0 and penalized["score"] == -0.3
    assert score_dict("pipeline", {**answer, "error": None})["masked"] == 0.0
    with pytest.raises(ValueError, match="failure cause must be one of"):
        masked_score("pipeline", "slow")


def test_prompt_too_long_is_its_own_part_and_says_what_to_do(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reward_batcher, "_too_long_seen", itertools.count(1))  # the first one is the one logged
    ok = {
        "reward": 0.0,
        "valid_json": True,
        "schema_reward": 1,
        "table_reward": -1,
        "f1": 1,
        "cell_accuracy": 0.0,
        "table_score": 0.0,
        "error": "prompt_too_long",
        "prompt_tokens": 5000,
        "prompt_limit": 2048,
    }
    with caplog.at_level("WARNING", logger="trainer.in_verl.reward_batcher"):
        parts = score_dict("pipeline", ok, "penalize")
    assert list(parts) == list(SCORE_KEYS["pipeline"])
    assert parts["prompt_too_long"] == 1.0 and parts["executor_failed"] == 0.0
    assert "5000 tokens, executor context 2048" in caplog.text and "Drop these documents" in caplog.text
    assert score_dict("pipeline", {**ok, "error": None})["prompt_too_long"] == 0.0


def test_executor_truncated_is_its_own_part_and_says_what_to_do(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table cut at the executor's max_tokens is counted apart, never as a plain low score."""
    monkeypatch.setattr(reward_batcher, "_truncated_seen", itertools.count(1))
    cut = {"reward": 0.0, "valid_json": True, "schema_reward": 1.0, "table_reward": -1.0, "f1": 1.0,
           "cell_accuracy": 0.0, "table_score": 0.0, "error": "executor_truncated"}  # fmt: skip
    with caplog.at_level("WARNING", logger="trainer.in_verl.reward_batcher"):
        parts = score_dict("pipeline", cut, "penalize")
    assert list(parts) == list(SCORE_KEYS["pipeline"])
    assert parts["executor_truncated"] == 1.0 and parts["executor_failed"] == 0.0 and parts["prompt_too_long"] == 0.0
    assert "max_tokens setting (docs/reward_api.md)" in caplog.text


@pytest.mark.service
async def test_the_token_from_the_environment_reaches_a_protected_reward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real reward API that wants a bearer token: the reward function sends the one the launcher put in
    ``TRAINER_REWARD_TOKEN``; a wrong one is the service's 401, named, not a low reward."""
    from trainer.serving.reward_api import reward_api_process

    truth = json.dumps(GOLD)
    with reward_api_process(None, token="s3cret-token") as api:
        monkeypatch.setenv(URL_ENV, api.url)
        monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
        try:
            s = await compute_score("schema", PREDS[1], truth, {"id": "x"})
            assert s["score"] == 1.0 and s["f1"] == 1.0
            monkeypatch.setenv(TOKEN_ENV, "wrong-token")
            with pytest.raises(RewardServiceError, match="401"):
                await compute_score("schema", PREDS[1], truth, {"id": "y"})
        finally:
            await _close()


@pytest.mark.service
async def test_a_sample_built_with_other_prompts_raises_in_every_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real reward API: a sample whose ``extra_info.prompt_version`` (the prompts its data was built with) is not
    the service's raises PromptVersionMismatch naming both, in mask mode too (a configuration bug, never a masked
    sample), and the failure log keeps it; the data's own version scores as before."""
    from shared import PROMPT_VERSION
    from trainer.reward_client import PromptVersionMismatch
    from trainer.serving.reward_api import reward_api_process

    log = tmp_path / "reward_failures.jsonl"
    truth = json.dumps(GOLD)
    with reward_api_process(None) as api:
        monkeypatch.setenv(URL_ENV, api.url)
        try:
            ok = await compute_score("schema", PREDS[1], truth, {"id": "a", "prompt_version": PROMPT_VERSION})
            assert ok["score"] == 1.0 and ok["masked"] == 0.0
            for mode in ("mask", "penalize"):
                old = {"id": f"b-{mode}", "prompt_version": "stage1-v0+stage2-v0"}
                with pytest.raises(PromptVersionMismatch) as e:
                    await compute_score("schema", PREDS[1], truth, old, failure_mode=mode, failure_log=str(log))
                assert "'stage1-v0+stage2-v0'" in str(e.value) and repr(PROMPT_VERSION) in str(e.value)
                assert f"{api.url}/reward/schema" in str(e.value)
        finally:
            await _close()
    logged = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["id"] for x in logged] == ["b-mask", "b-penalize"]
    assert all("PromptVersionMismatch" in x["error"] for x in logged)


# ---- impossible rewards: NaN, inf, out of the declared range -----------------------------------------------

IMPOSSIBLE = {"nan-": math.nan, "inf-": math.inf, "ninf-": -math.inf, "big-": 1e9, "neg-": -5.0}
CAUSE_OF = {
    "nan-": "reward_not_finite",
    "inf-": "reward_not_finite",
    "ninf-": "reward_not_finite",
    "big-": "reward_out_of_range",
    "neg-": "reward_out_of_range",
}


@contextlib.contextmanager
def injected_reward_api(rewards: dict[str, float]) -> Iterator[tuple[str, FaultInjectingRewardApi]]:
    """The real reward API app behind a fault injector that answers ``rewards`` for the items with those id
    prefixes (uvicorn in a thread)."""
    from services.reward_api.app import create_app
    from services.reward_api.settings import Settings
    from tests.helpers.servers import ThreadServer

    injector = FaultInjectingRewardApi(create_app(Settings(log_level="WARNING")), rewards)
    with ThreadServer(injector) as server:
        yield server.url, injector


def test_the_declared_ranges_are_the_request_configs() -> None:
    """Each kind's range is its config's [min_reward, max_reward] (overrides included); the pipeline's parts are
    checked within their own parts' bounds."""
    assert RewardRanges.of("schema", {}).bounds == (("reward", -1.0, 1.0),)
    assert RewardRanges.of("table", {"min_reward": 0, "max_reward": 2}).bounds == (("reward", 0.0, 2.0),)
    pipe = RewardRanges.of("pipeline", {"max_reward": 0.5, "table_reward": {"min_reward": -2}})
    assert pipe.bounds == (("reward", -1.0, 0.5), ("schema_reward", -1.0, 1.0), ("table_reward", -2.0, 1.0))
    ok = {"reward": 0.5, "schema_reward": 1.0, "table_reward": -2.0}
    assert pipe.problem(ok) is None
    assert pipe.problem({**ok, "reward": 0.75}) == (
        "reward_out_of_range",
        "reward=0.75 outside its declared range [-1, 0.5]",
    )
    assert pipe.problem({**ok, "table_reward": -math.inf}) == (
        "reward_not_finite",
        "table_reward=-inf (declared range [-2, 1])",
    )
    assert pipe.problem({**ok, "schema_reward": 1.5})[0] == "reward_out_of_range"  # type: ignore[index]
    with pytest.raises(ValueError, match="data_source must be one of"):
        RewardRanges.of("math", {})


def test_an_impossible_pipeline_part_is_masked_and_raises_in_penalize_mode(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN part: masked with its cause, and a warning names the value and the range; in penalize mode it raises
    (no penalty exists for a broken service)."""
    monkeypatch.setattr(reward_batcher, "_impossible_seen", itertools.count(1))  # the first one is the one logged
    answer = {"id": "x#1", "reward": 0.2, "valid_json": True, "schema_reward": 0.4, "table_reward": math.nan,
              "f1": 0.4, "cell_accuracy": 0.0, "table_score": 0.0, "error": None}  # fmt: skip
    with caplog.at_level("WARNING", logger="trainer.in_verl.reward_batcher"):
        assert score_dict("pipeline", answer) == masked_score("pipeline", "reward_not_finite")
    assert "impossible reward, masked as reward_not_finite" in caplog.text
    assert "item 'x#1': table_reward=nan (declared range [-1, 1])" in caplog.text
    with pytest.raises(ImpossibleRewardError, match=r"reward/pipeline .* item 'x#1': table_reward=nan"):
        score_dict("pipeline", answer, "penalize")
    # a failure the service names is masked by its own cause first (its reward is the service's penalty)
    failed = {**answer, "table_reward": -1.0, "error": "executor_failed"}
    assert score_dict("pipeline", failed) == masked_score("pipeline", "executor_failed")


async def test_impossible_rewards_are_masked_with_their_cause_and_the_good_ones_pass() -> None:
    """The real reward API behind an injector that answers NaN, inf, -inf, 1e9 and -5 for some items: through the
    reward function (mask mode, one batched request), each such sample is masked with its cause (score 0, the
    cause 1); every other sample gets exactly the service's reward."""
    truth = json.dumps(GOLD)
    ids = [f"{p}{i}" for p in IMPOSSIBLE for i in range(2)] + [f"ok-{i}" for i in range(len(PREDS))]
    preds = {i: PREDS[n % len(PREDS)] for n, i in enumerate(ids)}
    with injected_reward_api(IMPOSSIBLE) as (url, injector):
        try:
            scores = await asyncio.gather(
                *(compute_score("schema", preds[i], truth, {"id": i}, url=url, max_wait_ms=200) for i in ids)
            )
        finally:
            await _close()
    assert injector.requests == 1 and len(injector.injected) == 2 * len(IMPOSSIBLE)
    for item_id, s in zip(ids, scores, strict=True):
        prefix = item_id.split("-")[0] + "-"
        if prefix in IMPOSSIBLE:
            assert s == masked_score("schema", CAUSE_OF[prefix]), (item_id, s)
        else:
            want = compute_schema_reward_single(preds[item_id], GOLD["schema"])
            assert s["masked"] == 0.0 and s["score"] == want.reward and s["f1"] == want.f1, (item_id, s)


async def test_the_declared_range_follows_the_request_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With ``schema_config`` min_reward -5 (the phase's override, sent with the request), -5 is a possible reward
    and is trained on; 1e9 is still out of range. In penalize mode an impossible reward raises (never a penalty)
    and the failure log names it."""
    log = tmp_path / "reward_failures.jsonl"
    truth = json.dumps(GOLD)
    kw = {"schema_config": {"min_reward": -5.0}, "failure_log": str(log)}
    with injected_reward_api({"neg-": -5.0, "big-": 1e9}) as (url, _injector):
        try:
            neg = await compute_score("schema", PREDS[0], truth, {"id": "neg-1"}, url=url, **kw)
            big = await compute_score("schema", PREDS[0], truth, {"id": "big-1"}, url=url, **kw)
            with pytest.raises(ImpossibleRewardError, match=r"reward=1000000000\.0 outside its declared range"):
                await compute_score("schema", PREDS[0], truth, {"id": "big-2"}, url=url, failure_mode="penalize", **kw)
        finally:
            await _close()
    assert neg["masked"] == 0.0 and neg["score"] == -5.0
    assert big == masked_score("schema", "reward_out_of_range")
    logged = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["id"] for x in logged] == ["big-2"] and "ImpossibleRewardError" in logged[0]["error"]


async def test_the_client_config_is_built_once_for_many_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """VERL calls the reward function once per sample with the same reward_kwargs: the config is built (and its
    batcher key computed) once per worker process; other kwargs or another URL in the environment build another;
    a bad config is an error on every call, never cached."""
    built: list[dict[str, Any]] = []
    real = reward_batcher.client_config_from_kwargs

    def counting(kwargs: Any) -> RewardClientConfig:
        built.append(dict(kwargs))
        return real(kwargs)

    monkeypatch.setattr(reward_batcher, "client_config_from_kwargs", counting)
    reward_batcher._config_of.cache_clear()
    with FaultyRewardApi() as api:
        monkeypatch.setenv(URL_ENV, api.url)
        try:
            kw = {"max_batch": 8, "schema_config": {"f1_weight": 1.0}}
            first = await asyncio.gather(
                *(compute_score("schema", PREDS[i % 4], json.dumps(GOLD), {"id": f"s{i}"}, **kw) for i in range(40))
            )
            assert len(built) == 1 and len(batchers_of_running_loop()) == 1
            await compute_score("schema", PREDS[0], json.dumps(GOLD), {"id": "t"}, **{**kw, "max_batch": 4})
            assert len(built) == 2 and len(batchers_of_running_loop()) == 2
            monkeypatch.setenv(URL_ENV, api.url + "/")  # the environment is part of the config
            await compute_score("schema", PREDS[0], json.dumps(GOLD), {"id": "u"}, **kw)
            assert len(built) == 3
            for _ in range(2):
                with pytest.raises(ValueError, match=r"reward_kwargs\.max_batch"):
                    await compute_score("schema", PREDS[0], json.dumps(GOLD), {"id": "v"}, max_batch=0)
            assert len(built) == 5
        finally:
            await _close()
    # the same scores as a config built per sample
    for i, s in enumerate(first):
        assert s["score"] == compute_schema_reward_single(PREDS[i % 4], GOLD["schema"]).reward
    assert api.faults.batch_sizes == [8] * 5 + [1, 1]  # 40 samples in batches of 8, then one request each

"""The typed reward client against a real reward_api process: requests and answers as ``shared.wire`` models
with their values, the prompt_version check, and what is retried (a fault-injecting stand-in for the faults)."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import PROMPT_VERSION, prompt_version
from shared.prompts import TEMPLATE_DIR
from shared.wire import SchemaResponse, TableRequest, TableResponse
from tests.helpers.servers import RewardApiServer
from tests.trainer.in_verl.faulty_reward_api import Faults, FaultyRewardApi
from trainer.reward_client import (
    AsyncRewardClient,
    PromptVersionMismatch,
    RewardClient,
    RewardRequestError,
    RewardServiceError,
    build_request,
)
from trainer.serving.reward_api_env import reward_api_env

GOLD_SCHEMA = {"columns": [{"name": "name"}, {"name": "area"}, {"name": "price_range"}]}
GOLD_TABLE = {"columns": [{"name": "name"}, {"name": "area"}], "data": [["Alimentum", "riverside"], ["Zizzi", None]]}
SCHEMA_ITEMS = [
    {"id": "full", "prediction": '["name", "area", "price_range"]', "gold_schema": GOLD_SCHEMA},
    {"id": "two", "prediction": '{"columns": [{"name": "name"}, {"name": "area"}]}', "gold_schema": GOLD_SCHEMA},
    {"id": "bad", "prediction": "not json", "gold_schema": GOLD_SCHEMA},
]


@pytest.fixture(scope="module")
def reward_api() -> Iterator[RewardApiServer]:
    with RewardApiServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def other_stage2_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled Stage-2 template under another version: what a reward API serving other prompts answers."""
    data = json.loads((TEMPLATE_DIR / "stage2.json").read_text())
    data["version"] = "stage2-other"
    path = tmp_path_factory.mktemp("templates") / "stage2.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.service
def test_schema_round_trip_with_values(reward_api: RewardApiServer) -> None:
    with RewardClient(reward_api.url, PROMPT_VERSION) as client:
        answer = client.score(build_request("schema", SCHEMA_ITEMS))
    assert isinstance(answer, SchemaResponse)
    assert answer.prompt_version == PROMPT_VERSION and answer.count == 3 and answer.failed == 0
    full, two, bad = answer.results
    assert [r.id for r in answer.results] == ["full", "two", "bad"]
    assert (full.reward, full.valid_json, full.precision, full.recall, full.f1) == (1.0, True, 1.0, 1.0, 1.0)
    assert two.precision == 1.0 and two.recall == pytest.approx(2 / 3) and two.f1 == pytest.approx(0.8)
    assert two.reward == pytest.approx(0.8)
    assert (bad.reward, bad.valid_json, bad.f1) == (-1.0, False, 0.0)


@pytest.mark.service
def test_table_round_trip_with_values_and_a_config_override(reward_api: RewardApiServer) -> None:
    gold_rows = '{"name": "Alimentum", "area": "riverside"}\n{"name": "Zizzi", "area": null}'
    request = TableRequest.model_validate(
        {
            "items": [
                {"id": "gold", "prediction": gold_rows, "gold_table": GOLD_TABLE},
                {"id": "broken", "prediction": "[1, 2]", "gold_table": GOLD_TABLE},
            ],
            "config": {"min_reward": 0.0},
        }
    )
    with RewardClient(reward_api.url, PROMPT_VERSION) as client:
        answer = client.score(request)
    assert isinstance(answer, TableResponse)
    gold, broken = answer.results
    assert (gold.reward, gold.table_score, gold.valid_json) == (1.0, 1.0, True)
    assert (gold.n_pred_rows, gold.n_gold_rows) == (2, 2)
    assert gold.table_metric == "aligned" and gold.aligned is not None and gold.aligned.cell_f1 == 1.0
    assert (broken.valid_json, broken.n_pred_rows) == (False, 0)
    assert broken.reward == 0.0  # min_reward of the override: the invalid penalty -1 is clipped to it


@pytest.mark.service
async def test_the_async_client_answers_the_same(reward_api: RewardApiServer) -> None:
    request = build_request("schema", SCHEMA_ITEMS)
    with RewardClient(reward_api.url, PROMPT_VERSION) as client:
        sync_answer = client.score(request)
    async with AsyncRewardClient(reward_api.url, PROMPT_VERSION) as aclient:
        answers = await asyncio.gather(aclient.score(request), aclient.score(request))
    for answer in answers:
        assert isinstance(answer, SchemaResponse) and answer.results == sync_answer.results


@pytest.mark.service
def test_a_prompt_version_mismatch_raises_naming_both_versions(
    reward_api: RewardApiServer, other_stage2_template: Path
) -> None:
    request = build_request("schema", SCHEMA_ITEMS[:1])
    # the caller's data was built with other templates than the service's
    with RewardClient(reward_api.url, "stage1-old+stage2-old") as client, pytest.raises(PromptVersionMismatch) as e:
        client.score(request)
    msg = str(e.value)
    assert "'stage1-old+stage2-old'" in msg and repr(PROMPT_VERSION) in msg and reward_api.url in msg
    assert (e.value.expected, e.value.served) == ("stage1-old+stage2-old", PROMPT_VERSION)
    assert str(pickle.loads(pickle.dumps(e.value))) == msg  # Ray carries it from VERL's reward workers

    # a reward API serving another Stage-2 template: the caller built its data with the bundled one
    served = prompt_version(stage2=other_stage2_template)
    assert served != PROMPT_VERSION and served.endswith("+stage2-other")
    with RewardApiServer(reward_api_env(stage2_template=str(other_stage2_template))) as other:
        with RewardClient(other.url, PROMPT_VERSION) as client:
            with pytest.raises(PromptVersionMismatch, match=r"stage2-other.*built its data with") as e2:
                client.score(request)
            assert (e2.value.expected, e2.value.served) == (PROMPT_VERSION, served)
        with RewardClient(other.url, served) as client:  # the caller that built its data with those prompts
            assert client.score(request).results[0].reward == 1.0


def test_a_request_the_wire_rejects_is_named_before_it_is_sent() -> None:
    with pytest.raises(RewardRequestError, match=r"/reward/schema request: items\.0\.gold_schema"):
        build_request("schema", [{"id": "a", "prediction": "x"}])
    with pytest.raises(RewardRequestError, match=r"config\.f1_weigth"):
        build_request("schema", SCHEMA_ITEMS, {"f1_weigth": 1.0})
    with pytest.raises(ValueError, match="endpoint must be one of"):
        build_request("math", SCHEMA_ITEMS)  # type: ignore[call-overload]


def test_only_the_fields_the_caller_set_are_sent() -> None:
    """The service's own reward defaults apply to what the caller left out."""
    body = json.loads(RewardClient("http://127.0.0.1:9", PROMPT_VERSION)._body(build_request("schema", SCHEMA_ITEMS)))
    assert set(body) == {"items"} and body["items"][0] == SCHEMA_ITEMS[0]


def test_retries_5xx_then_answers_and_raises_on_4xx_at_once() -> None:
    """A fault-injecting stand-in: a 503 is retried, a 400 is not, the last failure raises (never a score)."""
    request = build_request("schema", SCHEMA_ITEMS)
    attempts: list[int] = []
    with FaultyRewardApi(Faults(fail_first=2, status=503)) as api:
        with RewardClient(api.url, PROMPT_VERSION, max_attempts=3, backoff_s=0.01,
                          on_attempt=lambda: attempts.append(1)) as client:  # fmt: skip
            assert [r.reward for r in client.score(request).results] == [1.0, pytest.approx(0.8), -1.0]
        assert len(attempts) == 3 and api.faults.requests == 3
    with (
        FaultyRewardApi(Faults(fail_first=5, status=503)) as api,
        RewardClient(api.url, PROMPT_VERSION, max_attempts=2, backoff_s=0.01) as client,
        pytest.raises(RewardServiceError, match=r"HTTP 503 after 2 attempt\(s\)"),
    ):
        client.score(request)
    with FaultyRewardApi(Faults(fail_first=5, status=400)) as api:
        with (
            RewardClient(api.url, PROMPT_VERSION, max_attempts=3, backoff_s=0.01) as client,
            pytest.raises(RewardRequestError, match="HTTP 400"),
        ):
            client.score(request)
        assert api.faults.requests == 1


# Measures the service itself, not a caller: pre-encoded bodies through an in-process ASGI transport.
OWN_TRANSPORT = {"bench/profile_local.py"}


def test_no_reward_request_is_posted_outside_the_client() -> None:
    """One client: no ``.post(".../reward/...")`` in trainer/ or bench/ except in trainer/reward_client.py."""
    import ast

    repo = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted([*(repo / "trainer").rglob("*.py"), *(repo / "bench").rglob("*.py")]):
        rel = str(path.relative_to(repo))
        if rel == "trainer/reward_client.py" or rel in OWN_TRANSPORT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "post":
                first = node.args[0] if node.args else None
                texts = [c.value for c in ast.walk(first) if isinstance(c, ast.Constant)] if first else []
                if any(isinstance(t, str) and "/reward" in t for t in texts):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"reward requests built by hand (use trainer.reward_client): {found}"

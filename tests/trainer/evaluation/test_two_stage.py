"""The two-stage runner's serving contract: π1's server is closed before π2's is opened, and π2 is not
served at all when π1 wrote no valid schema (its examples score 0, with no Stage-2 call)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from shared import read_golden
from tests.helpers.faulty_executor import FaultyExecutor
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.generation import GenerationConfig
from trainer.evaluation.two_stage import PromptStage, generate_quietly, run_two_stage, stage2_on_prediction
from trainer.serving.endpoint import Endpoint

EXAMPLES = read_golden(SAMPLE_DIR / "common_test_schemas.jsonl", 3)
GEN = GenerationConfig(max_tokens=8)


def test_stage2_is_built_only_on_a_valid_predicted_schema() -> None:
    ex = EXAMPLES[0]
    assert stage2_on_prediction(ex.text, "no schema here") is None
    assert stage2_on_prediction(ex.text, json.dumps(ex.schema_dict())) is not None


def test_pi1_is_closed_before_pi2_opens_and_pi2_is_not_served_without_a_valid_schema() -> None:
    # FaultyExecutor answers every prompt with one fixed text: here a schema, or none (no real model can
    # be made to do either on demand); what is checked is when each model is served, not the outputs
    schema = json.dumps(EXAMPLES[0].schema_dict())
    with FaultyExecutor("ok", content=schema) as pi1, FaultyExecutor("ok", content='{"a": 1}') as pi2:
        events: list[tuple[str, str, PromptStage]] = []

        @contextlib.contextmanager
        def serve(model: str, stage: PromptStage) -> Iterator[Endpoint]:
            events.append(("open", model, stage))
            yield Endpoint((pi1 if model == "/pi1" else pi2).url, "policy")
            events.append(("close", model, stage))

        records = run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly)
        assert events == [("open", "/pi1", "stage1"), ("close", "/pi1", "stage1"),
                          ("open", "/pi2", "stage2"), ("close", "/pi2", "stage2")]  # fmt: skip
        assert [r["table_prediction"] for r in records] == ['{"a": 1}'] * 3 and pi2.calls == 3
        assert all(r["stage2_messages_sha256"] and r["schema_model"] == "/pi1" for r in records)

        pi1.content = "no schema here"
        events.clear()
        records = run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly)
        assert events == [("open", "/pi1", "stage1"), ("close", "/pi1", "stage1")]
        assert all(r["table_prediction"] is None and r["stage2_messages_sha256"] is None for r in records)
        assert pi2.calls == 3  # no Stage-2 call

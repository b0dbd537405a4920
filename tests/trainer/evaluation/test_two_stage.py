"""The two-stage runner's serving contract: π1's server is closed before π2's is opened, and π2 is not
served at all when π1 wrote no valid schema (its examples score 0, with no Stage-2 call); with the schemas
of a Stage 1 already run (shared by settings with one π1), π1 is not served at all."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared import read_golden
from tests.helpers.faulty_executor import FaultyExecutor
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.generation import GenerationConfig
from trainer.evaluation.two_stage import (
    PromptStage,
    generate_quietly,
    run_two_stage,
    stage1_schemas,
    stage2_on_prediction,
)
from trainer.serving.endpoint import Endpoint

EXAMPLES = read_golden(SAMPLE_DIR / "common_test_schemas.jsonl", 3)
GEN = GenerationConfig(max_tokens=8)


def test_stage2_is_built_only_on_a_valid_predicted_schema() -> None:
    ex = EXAMPLES[0]
    assert stage2_on_prediction(ex.text, "no schema here") is None
    assert stage2_on_prediction(ex.text, json.dumps(ex.schema_dict())) is not None


@contextlib.contextmanager
def two_executors(schema: str) -> Iterator[tuple[FaultyExecutor, FaultyExecutor, list[tuple[str, str, str]], Any]]:
    """π1 answering ``schema``, π2 answering one table, and ``serve`` recording when each is opened/closed.
    FaultyExecutor answers every prompt with one fixed text (no real model can be made to write a given
    schema, or none, on demand); what is checked is when each model is served, not the outputs."""
    with FaultyExecutor("ok", content=schema) as pi1, FaultyExecutor("ok", content='{"a": 1}') as pi2:
        events: list[tuple[str, str, str]] = []

        @contextlib.contextmanager
        def serve(model: str, stage: PromptStage) -> Iterator[Endpoint]:
            events.append(("open", model, stage))
            yield Endpoint((pi1 if model == "/pi1" else pi2).url, "policy")
            events.append(("close", model, stage))

        yield pi1, pi2, events, serve


def test_pi1_is_closed_before_pi2_opens_and_pi2_is_not_served_without_a_valid_schema() -> None:
    schema = json.dumps(EXAMPLES[0].schema_dict())
    with two_executors(schema) as (pi1, pi2, events, serve):
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


def test_given_schemas_skip_stage1_and_pi1_is_not_served() -> None:
    schema = json.dumps(EXAMPLES[0].schema_dict())
    with two_executors(schema) as (pi1, _pi2, events, serve):
        # Stage 1 once, then its schemas given: the records are those of the whole run, field for field
        whole = run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly)
        schemas = stage1_schemas("sft+local", "/pi1", EXAMPLES, serve, GEN, generate_quietly)
        assert schemas == [r["schema_prediction"] for r in whole] and pi1.calls == 6
        events.clear()
        assert run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly, schemas=schemas) == whole
        assert events == [("open", "/pi2", "stage2"), ("close", "/pi2", "stage2")] and pi1.calls == 6  # no π1

        # the given schemas are the ones used: an invalid one gets no Stage-2 call
        given = [schema, "no schema here", schema]
        events.clear()
        records = run_two_stage("local", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly, schemas=given)
        assert [r["schema_prediction"] for r in records] == given and pi1.calls == 6
        assert [r["table_prediction"] for r in records] == ['{"a": 1}', None, '{"a": 1}']
        assert all(r["setting"] == "local" and r["schema_model"] == "/pi1" for r in records)
        assert events == [("open", "/pi2", "stage2"), ("close", "/pi2", "stage2")]


def test_schemas_of_the_wrong_length_are_refused_before_anything_is_served() -> None:
    def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
        raise AssertionError(f"served {model} for {stage}")

    with pytest.raises(ValueError, match=r"schemas: 2 for 3 examples"):
        run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly, schemas=["{}", "{}"])


def test_answers_cut_at_max_tokens_are_counted_and_fail_the_evaluation(tmp_path: Any) -> None:
    """An executor whose answers stop at the token limit: Phase D (``evaluate pipeline``) counts the cut answers
    per setting and stage, records max_tokens, writes its report and then fails naming the setting and the count;
    with the share allowed it finishes, the counts in metrics.json and the report."""
    from typer.testing import CliRunner

    from trainer.cli import app

    ex = EXAMPLES[0]
    with FaultyExecutor(content=json.dumps(ex.schema_dict()), finish_reason="length") as fx:
        setting = f"cut={fx.url},{fx.model},{fx.url},{fx.model}"
        base = ["evaluate", "pipeline", "--golden", str(SAMPLE_DIR / "common_test_schemas.jsonl"), "--limit", "3",
                "--max-tokens", "40", "--setting", setting]  # fmt: skip
        failed = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")], env={"COLUMNS": "300"})
        passed = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), "--max-truncated-share", "1"])
    assert failed.exit_code == 2, failed.output
    assert "setting 'cut', π1 schemas: 3 of 3 answers stopped at the token limit (max_tokens 40" in failed.output
    report = (tmp_path / "a" / "report.md").read_text()  # written before the failure: the numbers are there
    assert "Max tokens per answer: 40" in report and "| cut | schema | 3 | 3 | 100.0% |" in report
    assert passed.exit_code == 0, passed.output
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["max_tokens"] == 40
    assert metrics["settings"]["cut"]["truncated"]["schema"] == {
        "cut": 3, "answers": 3, "share": 1.0, "ids": [e.id for e in EXAMPLES]
    }  # fmt: skip
    assert metrics["settings"]["cut"]["truncated"]["table"]["cut"] == 3  # π2 on the (valid) schemas: cut too


def test_a_cut_schema_in_the_c2_precompute_is_counted_apart_from_invalid_ones(tmp_path: Any) -> None:
    """A π1 schema cut at the token limit is a configuration fault: counted as ``truncated``, not as π1's invalid
    schema; past the allowed share the precompute fails naming the split."""
    from trainer.data.precompute import precompute_c2
    from trainer.evaluation.generation import Completion, TruncatedAnswersError

    def cut_first(examples: Any, _split: str) -> list[str]:
        texts = [json.dumps(e.schema_dict()) for e in examples]
        return [Completion(texts[0], "length"), *(Completion(t, "stop") for t in texts[1:])]

    rep = precompute_c2(SAMPLE_DIR, tmp_path, cut_first, "pi1", limit=3, on_invalid="skip", max_truncated_share=0.5)
    assert rep.counts == {"train": 2, "validation": 2} and rep.invalid == {"train": 0, "validation": 0}
    assert [len(v) for v in rep.truncated_ids.values()] == [1, 1]
    with pytest.raises(TruncatedAnswersError, match=r"C2 precompute, train: π1 schemas: 1 of 3 answers stopped"):
        precompute_c2(SAMPLE_DIR, tmp_path / "x", cut_first, "pi1", limit=3, max_truncated_share=0.0)


def test_evaluate_score_reads_the_cut_answers_of_infer_records(tmp_path: Any) -> None:
    """``trainer infer`` records say which answers stopped at the token limit; ``evaluate score`` counts them and
    fails past the share, as Phase D does."""
    from typer.testing import CliRunner

    from trainer.cli import app

    preds = tmp_path / "p.jsonl"
    preds.write_text(
        "".join(
            json.dumps({"id": e.id, "stage": "stage1", "prediction": "{", "truncated": i == 0}) + "\n"
            for i, e in enumerate(EXAMPLES)
        )
    )
    base = ["evaluate", "score", "--golden", str(SAMPLE_DIR / "common_test_schemas.jsonl"), "--predictions",
            f"x={preds}"]  # fmt: skip
    failed = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")], env={"COLUMNS": "300"})
    assert failed.exit_code == 2 and "setting 'x', π1 schemas: 1 of 3 answers stopped" in failed.output
    passed = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), "--max-truncated-share", "0.5"])
    assert passed.exit_code == 0, passed.output
    cut = json.loads((tmp_path / "b" / "metrics.json").read_text())["settings"]["x"]["truncated"]["schema"]
    assert cut["cut"] == 1 and cut["answers"] == 3


def test_a_refused_document_is_its_own_outcome_and_a_failed_request_names_where_and_why() -> None:
    """A document too long for π2 (vLLM's 400) is that document's outcome: no table, refused and why, the others
    answered. A π1 that never answers: the evaluation stops with the setting, the stage, the model and the
    document named, and why."""
    from trainer.evaluation.generation import GenerationFailed

    schema = json.dumps(EXAMPLES[0].schema_dict())
    prompts = [stage2_on_prediction(ex.text, schema) for ex in EXAMPLES]
    sizes = [sum(len(m["content"]) for m in p or []) for p in prompts]
    longest = max(range(len(EXAMPLES)), key=sizes.__getitem__)
    with two_executors(schema) as (pi1, pi2, _events, serve):
        pi2.too_long_chars = sizes[longest] - 1  # only the longest Stage-2 prompt is over the context
        records = run_two_stage("pipe", "/pi1", "/pi2", EXAMPLES, serve, GEN, generate_quietly)
        assert pi2.calls == 3  # one call each: a refusal is not retried
        for i, r in enumerate(records):
            assert r["schema_refused"] is False and r["schema_refusal"] is None
            assert r["table_refused"] is (i == longest)
            assert r["table_prediction"] == ("" if i == longest else '{"a": 1}')
        assert "HTTP 400" in records[longest]["table_refusal"] and "maximum context length" in records[longest][
            "table_refusal"]  # fmt: skip
        pi1.mode, pi1.hang_s = "hang", 30.0
        quick = GenerationConfig(max_tokens=8, timeout_s=1.0, max_attempts=1)
        with pytest.raises(GenerationFailed, match=r"^setting 'sft', Stage 1 \(π1 /pi1\), document ") as err:
            run_two_stage("sft", "/pi1", "/pi2", EXAMPLES, serve, quick, generate_quietly)
        assert str(err.value).endswith("no answer within 1.0 s (the call's deadline, its retries included)")
        assert f"policy at {pi1.url}/v1/chat/completions" in str(err.value)  # the executor, named

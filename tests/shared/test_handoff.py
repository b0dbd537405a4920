"""The Stage 1 → Stage 2 hand-off (``shared.stage2_handoff``): π2's prompt on a parsed predicted schema, or
the wire's reason there is none; the schema parsed once and passed on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shared import (
    INVALID_JSON,
    ParsedSchema,
    Stage2Handoff,
    build_stage2_messages,
    compute_schema_reward_parsed,
    compute_schema_reward_single,
    load_template,
    parse_schema_text,
    pipeline_reward_for_invalid_schema,
    stage2_handoff,
    stage2_template,
)
from shared.prompts import PromptTemplate, TemplateError

GOLD_SCHEMA = {"table_id": "e2e-test-1", "columns": [{"name": "name"}, {"name": "area"}]}
GOLD_TABLE = {**GOLD_SCHEMA, "data": [["Alimentum", "city centre"]]}


def template(tmp_path: Path, user: str = "S=$schema D=$document") -> PromptTemplate:
    path = tmp_path / "s2.json"
    fields = {"version": "t-1", "system": "SYS", "policy": "P", "output_format": "O", "task": "T", "user": user}
    path.write_text(json.dumps(fields))
    return load_template(path, 2)


def test_a_valid_schema_gives_the_stage2_messages_and_its_parsed_names(tmp_path: Path) -> None:
    h = stage2_handoff("Alimentum $x {y}", '```json\n{"columns": [{"name": "name"}, "area"]}\n```', template(tmp_path))
    assert h.reason is None
    assert h.schema == ParsedSchema(("name", "area"), True)
    fields = '{"schema_id": "schema", "structure": "table", "fields": [{"name": "name"}, {"name": "area"}]}'
    assert h.messages == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": f"S={fields} D=Alimentum $x {{y}}"},
    ]


@pytest.mark.parametrize(
    "prediction",
    [
        '{"columns": [{"name": "name"}, {"name": "area"}]}',
        '{"fields": ["name", "area"]}',
        '["name", {"name": "area", "type": "text"}]',
        '{"table_id": "rotowire_sent-train-3", "columns": [{"name": "name", "description": "d"}]}',
        "```\n[]\n```",
        '["a", "a"]',
    ],
)
def test_the_prompt_is_the_one_the_schema_text_itself_gives(prediction: str) -> None:
    """The hand-off builds on the parsed names; the prompt equals ``build_stage2_messages`` on the raw text
    (what the reward service and the two-stage runner sent before), with the bundled template."""
    tpl = stage2_template()
    h = stage2_handoff("doc", prediction, tpl)
    assert h.messages == build_stage2_messages("doc", prediction, tpl)
    assert h.schema == parse_schema_text(prediction)


@pytest.mark.parametrize(
    ("prediction", "error"),
    [
        ("", "invalid JSON: JSONDecodeError"),
        ("  \n ", "invalid JSON: JSONDecodeError"),
        ("```json\n```", "invalid JSON: JSONDecodeError"),
        ("name, area", "invalid JSON: JSONDecodeError"),
        ('["name"] and more', "invalid JSON: JSONDecodeError"),
        ("null", "schema must be an object or a list, got NoneType"),
        ("{}", "schema object has neither 'columns' nor 'fields'"),
        ('{"columns": "name"}', "schema 'columns' must be a list, got str"),
        ('{"columns": [{"name": 1}]}', "schema columns[0] must be a string or an object with a string 'name'"),
        ("[" * 5000 + "]" * 5000, "invalid JSON: RecursionError"),
    ],
)
def test_an_empty_or_unparsable_schema_has_no_prompt_and_says_invalid_json(prediction: str, error: str) -> None:
    h = stage2_handoff("doc", prediction, stage2_template())
    assert (h.messages, h.reason) == (None, "invalid_json")
    assert h.schema == ParsedSchema((), False, error)


@pytest.mark.parametrize("prediction", ["[]", '{"columns": []}', '{"fields": []}'])
def test_a_schema_with_no_columns_is_handed_on_with_no_fields(prediction: str, tmp_path: Path) -> None:
    """It parses, so π2 is asked for it (the reward service always made that call); its schema scores 0."""
    h = stage2_handoff("doc", prediction, template(tmp_path))
    assert h.reason is None and h.schema == ParsedSchema((), True)
    assert h.messages is not None
    assert h.messages[1]["content"] == 'S={"schema_id": "schema", "structure": "table", "fields": []} D=doc'
    assert compute_schema_reward_parsed(h.schema, GOLD_SCHEMA).reward == 0.0


def test_the_reason_is_the_wire_error_of_an_invalid_schema() -> None:
    h = stage2_handoff("doc", "not json", stage2_template())
    schema = compute_schema_reward_parsed(h.schema, GOLD_SCHEMA)
    assert h.reason == INVALID_JSON == pipeline_reward_for_invalid_schema(schema, GOLD_TABLE).error
    assert (schema.valid_json, schema.reward, schema.error) == (False, -1.0, "invalid_json")


@pytest.mark.parametrize("prediction", ['{"columns": [{"name": "Name"}, {"name": "near"}]}', "nope", "[]"])
def test_the_passed_on_schema_scores_as_the_text_does(prediction: str) -> None:
    """Parsed once: scoring the hand-off's schema gives the reward the text gives."""
    h = stage2_handoff("doc", prediction, stage2_template())
    assert compute_schema_reward_parsed(h.schema, GOLD_SCHEMA) == compute_schema_reward_single(prediction, GOLD_SCHEMA)


def test_a_broken_template_raises_and_is_never_an_invalid_schema(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"unknown placeholder \$nope"):
        stage2_handoff("doc", '["name"]', template(tmp_path, "S=$schema $nope"))
    # An invalid schema stops before the template is rendered: its reason is still the schema's.
    assert stage2_handoff("doc", "", template(tmp_path, "S=$schema $nope")).reason == "invalid_json"


def test_the_result_is_frozen_and_holds_messages_or_a_reason() -> None:
    h = stage2_handoff("doc", '["name"]', stage2_template())
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.reason = "invalid_json"  # type: ignore[misc]
    parsed = ParsedSchema(("name",), True)
    with pytest.raises(ValueError, match="either messages or a reason"):
        Stage2Handoff(parsed)
    with pytest.raises(ValueError, match="either messages or a reason"):
        Stage2Handoff(parsed, messages=[], reason="invalid_json")

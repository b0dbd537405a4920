import json
from pathlib import Path

import pytest

from shared import (
    PROMPT_VERSION,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema_json,
    gold_ndjson,
    load_template,
    parse_ndjson,
    stage2_schema,
)
from shared.prompts import TemplateError

SCHEMA = {"table_id": "t1", "columns": [{"name": "name"}, {"name": "area"}]}
TABLE = {"table_id": "t1", "columns": [{"name": "name"}, {"name": "area"}], "data": [["Alimentum", None]]}


def test_stage1_sections_and_metadata() -> None:
    msgs = build_stage1_messages("Alimentum is {weird} $text", metadata={"language": "fr"})
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    for section in ("<|policy|> [POLICY]", "<|metadata|> [METADATA]", "<|document|> [DOCUMENT]", "<|task|> [TASK]"):
        head, tag = section.split(" ")
        assert f"{head}\n{tag}" in user
    meta = json.loads(user.split("[METADATA]\n", 1)[1].split("\n\n", 1)[0])
    assert meta["language"] == "fr" and "structure_candidates" in meta
    assert "Alimentum is {weird} $text" in user  # document text is never interpreted


def test_stage2_sections_schema_and_target() -> None:
    msgs = build_stage2_messages("Alimentum text", SCHEMA)
    assert msgs[0]["content"].startswith("You convert documents into tabular data")
    user = msgs[1]["content"]
    for tag in ("[POLICY]", "[SCHEMA]", "<|document|>\n[DOCUMENT]", "[OUTPUT_FORMAT]", "[TASK]"):
        assert tag in user
    schema = json.loads(user.split("[SCHEMA]\n", 1)[1].split("\n\n", 1)[0])
    assert schema == {"schema_id": "schema", "structure": "table", "fields": [{"name": "name"}, {"name": "area"}]}


def test_stage2_schema_id_is_neutral_whatever_the_gold_id() -> None:
    """The gold id (source + split, e.g. ``rotowire_sent-train-3``) never reaches the prompt."""
    gold = {"table_id": "rotowire_sent-train-3", "columns": [{"name": "team"}]}
    user = build_stage2_messages("doc", gold)[1]["content"]
    assert "rotowire" not in user and "train" not in user.split("[SCHEMA]", 1)[1].split("<|document|>", 1)[0]
    assert json.loads(user.split("[SCHEMA]\n", 1)[1].split("\n\n", 1)[0])["schema_id"] == "schema"
    assert stage2_schema({"schema_id": "e2e-test-9", "fields": ["x"]})["schema_id"] == "schema"
    assert PROMPT_VERSION.endswith("+stage2-v2")  # the prompt changed, so did its version


def test_stage2_schema_id_is_configured_by_the_template(tmp_path: Path) -> None:
    tpl_path = tmp_path / "s2.json"
    tpl_path.write_text(
        json.dumps(
            {
                "version": "v",
                "schema_id": "doc_table",
                "system": "S",
                "policy": "P",
                "output_format": "O",
                "task": "T",
                "user": "$schema",
            }
        )
    )
    tpl = load_template(tpl_path, 2)
    assert json.loads(build_stage2_messages("d", SCHEMA, template=tpl)[1]["content"])["schema_id"] == "doc_table"
    tpl_path.write_text(tpl_path.read_text().replace('"doc_table"', '""'))
    load_template.cache_clear()
    with pytest.raises(TemplateError, match="schema_id"):
        load_template(tpl_path, 2)


@pytest.mark.parametrize(
    "shape",
    [
        {"columns": [{"name": "name"}, {"name": "area"}]},
        {"fields": ["name", {"name": "area"}]},
        ["name", "area"],
        '```json\n{"columns": ["name", "area"]}\n```',
    ],
)
def test_stage2_schema_from_any_shape(shape) -> None:
    assert [f["name"] for f in stage2_schema(shape)["fields"]] == ["name", "area"]


def test_stage2_schema_keeps_field_details_and_rejects_garbage() -> None:
    s = stage2_schema({"fields": [{"name": "x", "type": "int"}]})
    assert s["fields"] == [{"name": "x", "type": "int"}]
    with pytest.raises(ValueError, match="does not parse"):
        stage2_schema("not json")


def test_targets() -> None:
    assert json.loads(canonical_schema_json(SCHEMA)) == {"columns": [{"name": "name"}, {"name": "area"}]}
    nd = gold_ndjson(TABLE)
    assert nd == '{"name": "Alimentum", "area": null}'
    assert parse_ndjson(nd) == [{"name": "Alimentum", "area": None}]


def test_version_and_custom_template(tmp_path: Path) -> None:
    assert PROMPT_VERSION.startswith("stage1-") and "+stage2-" in PROMPT_VERSION
    custom = tmp_path / "s2.json"
    custom.write_text(
        json.dumps(
            {
                "version": "mine-7",
                "system": "SYS",
                "policy": "P",
                "output_format": "O",
                "task": "T",
                "user": "S=$schema D=$document",
            }
        )
    )
    tpl = load_template(custom, 2)
    msgs = build_stage2_messages("doc", ["x"], template=tpl)
    assert tpl.version == "mine-7"
    assert msgs == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": 'S={"schema_id": "schema", "structure": "table", "fields": [{"name": "x"}]} D=doc'},
    ]


def test_bad_template_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "v", "system": "s", "policy": "p", "user": "u"}))
    with pytest.raises(TemplateError, match=r"bad\.json.*'task'"):
        load_template(bad, 1)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"version": "v", "system": "s", "policy": "p", "task": "t", "user": "$nope"}))
    with pytest.raises(TemplateError, match="nope"):
        build_stage1_messages("x", template=load_template(unknown, 1))

"""Stage-1 and Stage-2 prompt builders: the only place prompts are made (docs/prompts.md).

Templates are JSON files with a ``version`` string and ``string.Template`` fields (``$document``
and friends, so JSON braces in the text need no escaping). The bundled ones live in
``shared/templates``. A user whose SFT checkpoints were trained on other wording points
``STAGE1_TEMPLATE`` / ``STAGE2_TEMPLATE`` (or the ``template=`` argument) at their own file.
The template version is recorded in every dataset row and reported by the reward API.

The Stage-2 ``[SCHEMA]`` carries a ``schema_id``. It is neutral by default (the template's optional
``schema_id`` field, else ``"schema"``), never the gold example id: ids such as
``rotowire_sent-train-…`` would tell the model the source and the split (``train`` in training,
``test`` in evaluation), and real users' ids carry no such meaning. Because SFT data, RL data, the
reward API and evaluation all render through the same template, they all send the same id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from shared.schema_parsing import parse_schema_text, schema_names_from_obj
from shared.table_metrics import gold_table_to_rows

TEMPLATE_DIR = Path(__file__).parent / "templates"
DEFAULT_STRUCTURE_CANDIDATES = ("table", "record", "list")
Message = dict[str, str]

DEFAULT_SCHEMA_ID = "schema"
_STAGE_FIELDS = {
    1: ("version", "system", "policy", "task", "user"),
    2: ("version", "system", "policy", "output_format", "task", "user"),
}


class TemplateError(ValueError):
    """A prompt template file is missing a field or names an unknown placeholder."""


@dataclass(frozen=True)
class PromptTemplate:
    """One stage's wording. ``user`` is a ``string.Template`` over the other fields and the inputs."""

    stage: int
    version: str
    system: str
    user: str
    parts: Mapping[str, str]
    schema_id: str = DEFAULT_SCHEMA_ID

    def render_user(self, **values: str) -> str:
        try:
            return Template(self.user).substitute({**self.parts, **values})
        except KeyError as exc:
            raise TemplateError(
                f"stage-{self.stage} template {self.version!r}: unknown placeholder ${exc.args[0]}"
            ) from None


@lru_cache(maxsize=32)
def load_template(path: str | Path, stage: int) -> PromptTemplate:
    """Load and check a template file; the error names the file and the missing field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateError(f"{p}: cannot read template: {exc}") from exc
    if not isinstance(data, dict):
        raise TemplateError(f"{p}: a template must be a JSON object")
    for key in _STAGE_FIELDS[stage]:
        if not isinstance(data.get(key), str) or not data[key]:
            raise TemplateError(f"{p}: field '{key}' is missing or not a non-empty string")
    parts = {k: data[k] for k in _STAGE_FIELDS[stage] if k not in ("version", "system", "user")}
    schema_id = data.get("schema_id", DEFAULT_SCHEMA_ID)
    if not isinstance(schema_id, str) or not schema_id:
        raise TemplateError(f"{p}: field 'schema_id' must be a non-empty string when given")
    return PromptTemplate(stage, data["version"], data["system"], data["user"], parts, schema_id)


def stage1_template(path: str | Path | None = None) -> PromptTemplate:
    """The Stage-1 template: ``path``, else ``$STAGE1_TEMPLATE``, else the bundled one."""
    return load_template(path or os.environ.get("STAGE1_TEMPLATE") or TEMPLATE_DIR / "stage1.json", 1)


def stage2_template(path: str | Path | None = None) -> PromptTemplate:
    """The Stage-2 template: ``path``, else ``$STAGE2_TEMPLATE``, else the bundled one."""
    return load_template(path or os.environ.get("STAGE2_TEMPLATE") or TEMPLATE_DIR / "stage2.json", 2)


def prompt_version(stage1: str | Path | None = None, stage2: str | Path | None = None) -> str:
    """The combined version string stored with datasets and reported by the reward API."""
    return f"{stage1_template(stage1).version}+{stage2_template(stage2).version}"


PROMPT_VERSION = prompt_version()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def canonical_schema(gold_schema: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    """The canonical schema object: ``{"columns": [{"name": ...}, ...]}`` in gold order."""
    return {"columns": [{"name": n} for n in schema_names_from_obj(gold_schema)]}


def canonical_schema_json(gold_schema: Mapping[str, Any] | Sequence[Any]) -> str:
    """Stage-1 assistant target: the canonical gold schema as compact JSON."""
    return _dumps(canonical_schema(gold_schema))


def build_stage1_messages(
    text: str,
    metadata: Mapping[str, Any] | None = None,
    template: PromptTemplate | None = None,
) -> list[Message]:
    """System + user messages for π1. METADATA always has ``language`` and ``structure_candidates``."""
    tpl = template or stage1_template()
    meta: dict[str, Any] = {"language": "en", "structure_candidates": list(DEFAULT_STRUCTURE_CANDIDATES)}
    meta.update(metadata or {})
    user = tpl.render_user(metadata=_dumps(meta), document=text)
    return [{"role": "system", "content": tpl.system}, {"role": "user", "content": user}]


def stage2_schema(
    schema: Mapping[str, Any] | Sequence[Any] | str, schema_id: str = DEFAULT_SCHEMA_ID, structure: str = "table"
) -> dict[str, Any]:
    """``{"schema_id", "structure", "fields": [{"name"}, ...]}`` from any accepted schema shape.

    ``schema`` may be decoded JSON or model text (fence allowed); a text that does not parse raises
    ``ValueError`` with the reason. Extra per-field keys (``type``, ``description``) are kept. A
    ``table_id``/``schema_id`` inside ``schema`` is ignored on purpose (see the module docstring).
    """
    if isinstance(schema, str):
        parsed = parse_schema_text(schema)
        if not parsed.valid:
            raise ValueError(f"schema does not parse: {parsed.error}")
        fields: list[dict[str, Any]] = [{"name": n} for n in parsed.names]
    else:
        names = schema_names_from_obj(schema)
        items = schema if isinstance(schema, Sequence) else schema.get("columns", schema.get("fields"))
        fields = [
            {**item, "name": name} if isinstance(item, Mapping) else {"name": name}
            for item, name in zip(items or [], names, strict=True)
        ]
    return {"schema_id": schema_id, "structure": structure, "fields": fields}


def build_stage2_messages(
    text: str,
    schema: Mapping[str, Any] | Sequence[Any] | str,
    template: PromptTemplate | None = None,
    schema_id: str | None = None,
) -> list[Message]:
    """System + user messages for π2 from a document and a schema in any accepted shape.

    ``schema_id`` defaults to the template's neutral id; pass one only for an id that carries no
    information about the example (the module docstring says why).
    """
    tpl = template or stage2_template()
    user = tpl.render_user(schema=_dumps(stage2_schema(schema, schema_id or tpl.schema_id)), document=text)
    return [{"role": "system", "content": tpl.system}, {"role": "user", "content": user}]


def gold_ndjson(gold_table: Mapping[str, Any]) -> str:
    """Stage-2 assistant target: one JSON object per gold row, keys in schema order."""
    return "\n".join(_dumps(row) for row in gold_table_to_rows(gold_table))

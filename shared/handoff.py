"""The Stage 1 → Stage 2 hand-off: a document and π1's predicted schema text become π2's prompt, or the
named reason there is none. The reward service's pipeline reward and the trainer's two-stage runner
(Phase D, the demo, C2's precompute) both call :func:`stage2_handoff`, so they decide validity alike.

Policy:

- The predicted schema is parsed once (``parse_schema_text``); the parsed value travels in the result,
  so a caller scores it (``compute_schema_reward_parsed``) without parsing it again.
- A text that does not parse as a schema (empty, not JSON, no ``columns``/``fields``, a bad column)
  has no Stage-2 prompt; its reason is ``invalid_json``, the ``error`` the reward service sends for
  such an item, so the wire and the evaluation name it alike.
- A schema that parses is handed on, even one with no columns: π2 is asked for a table with no fields,
  as the reward service always did.
- The prompt is ``build_stage2_messages`` on the parsed column names with the caller's template, so it
  is exactly the prompt the schema text itself would give (neutral ``schema_id``, names only).
- A broken template raises (``TemplateError``); it is never taken for an invalid schema.

Whether the prompt fits a context is not decided here: the reward service learns it from its executor
(``prompt_too_long``), and the trainer's C2 precompute checks it with the executor's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.prompts import Message, PromptTemplate, build_stage2_messages
from shared.rewards import INVALID_JSON
from shared.schema_parsing import ParsedSchema, parse_schema_text

NoStage2Reason = Literal["invalid_json"]


@dataclass(frozen=True, slots=True)
class Stage2Handoff:
    """What a predicted schema hands on to Stage 2. ``schema`` is the parsed prediction (always set: pass it
    on instead of parsing again). Exactly one of ``messages`` (π2's prompt) and ``reason`` (why there is
    none, a wire ``error`` name) is set."""

    schema: ParsedSchema
    messages: list[Message] | None = None
    reason: NoStage2Reason | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.reason is None):
            raise ValueError("a Stage-2 hand-off has either messages or a reason, not both or neither")


def stage2_handoff(text: str, predicted_schema: str, template: PromptTemplate) -> Stage2Handoff:
    """The Stage-2 prompt for document ``text`` on ``predicted_schema`` (π1's raw output) with ``template``,
    or the reason there is none; see the module docstring for the policy."""
    parsed = parse_schema_text(predicted_schema)
    if not parsed.valid:
        return Stage2Handoff(parsed, reason=INVALID_JSON)
    return Stage2Handoff(parsed, messages=build_stage2_messages(text, list(parsed.names), template))

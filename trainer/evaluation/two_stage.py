"""The two-stage pipeline, run in one place: Stage 1 (document → schema) with π1, then Stage 2
(document + the *predicted* schema → table) with π2, as Phase D scores it.

``trainer evaluate pipeline``, the loop's Phase D and the demo all call :func:`run_two_stage`, and
:func:`stage2_on_prediction` is the trainer's way to a Stage-2 prompt on a predicted schema (C2's
precompute uses it too): the shared hand-off (``shared.stage2_handoff``) that the reward service's
pipeline reward uses, so both decide validity alike. A predicted schema that is no valid schema gets no
Stage-2 call: its table scores 0. Settings that share a π1 can run its Stage 1 once
(:func:`stage1_schemas`) and pass those schemas to each setting's :func:`run_two_stage` (``schemas=``): the
same schemas, and no repeated work.

Where a model runs is the caller's business. ``serve(model, stage)`` is "give me a URL for this model":
a context manager that yields an :class:`~trainer.serving.endpoint.Endpoint` while the model is served
(an external URL, an executor started for that stage, or one the caller keeps up across both stages).
π1's is closed before π2's is opened, so one server at a time is enough, and π2 is not served at all
when no schema was valid.

A prompt the executor refuses (HTTP 400: longer than its context, say) is that document's outcome, not the run's:
its answer is empty (the document scores as wrong), and its record says so (``schema_refused``/``table_refused``
and why), for Phase D to count and limit. With an :class:`~trainer.evaluation.answer_log.AnswerLog`, each answer
is kept as it arrives and the answers it holds for the same prompts are not asked again: a run stopped by a dead
executor continues where it stopped, and a model whose answers are all kept is not served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from shared import PROMPT_VERSION, GoldenExample, build_stage1_messages, stage2_handoff, stage2_template
from shared.prompts import PromptTemplate
from trainer.evaluation.generation import (
    GenerationClient,
    GenerationConfig,
    GenerationFailed,
    Message,
    generate_with_progress,
    messages_hash,
    refusal,
    truncated,
)
from trainer.serving.endpoint import Endpoint

if TYPE_CHECKING:
    from trainer.evaluation.answer_log import AnswerLog

PromptStage = Literal["stage1", "stage2"]


class ServeModel(Protocol):
    """Give me a URL for this model (for this prompt stage), valid while the context is open."""

    def __call__(self, model: str, stage: PromptStage) -> AbstractContextManager[Endpoint]: ...


# How one stage's prompts are sent: (client, prompts, progress label) → outputs in order.
Generate = Callable[[GenerationClient, Sequence[Sequence[Message]], str], Coroutine[Any, Any, list[str]]]


async def generate_quietly(client: GenerationClient, prompts: Sequence[Sequence[Message]], _desc: str) -> list[str]:
    """No progress bar (the loop's Phase-D settings run side by side, where bars would interleave)."""
    return await client.generate(prompts)


def stage2_on_prediction(
    text: str, predicted_schema: str, template: PromptTemplate | None = None
) -> list[Message] | None:
    """The Stage-2 prompt on π1's predicted schema (``shared.stage2_handoff`` with ``template``, by default
    the configured Stage-2 template), or None when that hand-off has none (no valid schema)."""
    return stage2_handoff(text, predicted_schema, template or stage2_template()).messages


def answer_stage(
    stage: PromptStage,
    where: str,
    model: str,
    examples: Sequence[GoldenExample],
    prompts: Mapping[int, Sequence[Message]],
    serve: ServeModel,
    gen: GenerationConfig,
    generate: Generate,
    desc: str,
    log: AnswerLog | None = None,
) -> dict[int, str]:
    """One stage's answers, by example index, to ``prompts`` (example index → messages): those ``log`` holds for
    the same prompt, then the others from ``model`` (served only if some are left), each kept in ``log`` as it
    arrives; a refused prompt's answer is empty and says why. A call that fails raises
    :class:`GenerationFailed` naming ``where``, the document and why."""
    hashes = {i: messages_hash(p) for i, p in prompts.items()}
    answers: dict[int, str] = {}
    for i in prompts:
        if log is not None and (kept := log.get(stage, examples[i].id, hashes[i])) is not None:
            answers[i] = kept
    todo = [i for i in sorted(prompts) if i not in answers]
    if not todo:
        return answers

    def keep(j: int, answer: str) -> None:
        if log is not None:
            log.add(stage, examples[todo[j]].id, hashes[todo[j]], answer)

    with serve(model, stage) as ep:
        client = GenerationClient(ep.url, ep.served_name, gen, keep_refused=True, on_answer=keep)
        try:
            outs = asyncio.run(generate(client, [prompts[i] for i in todo], desc))
        except GenerationFailed as exc:
            i = todo[exc.index]
            raise GenerationFailed(f"{where}, document {examples[i].id} ({exc.where})", i, exc.why) from exc
    answers.update(zip(todo, outs, strict=True))
    return answers


def stage1_schemas(
    label: str,
    pi1: str,
    examples: Sequence[GoldenExample],
    serve: ServeModel,
    gen: GenerationConfig,
    generate: Generate = generate_with_progress,
    *,
    log: AnswerLog | None = None,
) -> list[str]:
    """Stage 1 alone: π1's schemas, one per example in order (``label`` names the progress bar); ``log``: the
    answers kept so far, and where each new one is kept."""
    s1 = {i: build_stage1_messages(ex.text) for i, ex in enumerate(examples)}
    where = f"setting {label!r}, Stage 1 (π1 {pi1})"
    out = answer_stage("stage1", where, pi1, examples, s1, serve, gen, generate, f"{label} π1 schemas", log)
    return [out[i] for i in range(len(examples))]


def run_two_stage(
    setting: str,
    pi1: str,
    pi2: str,
    examples: Sequence[GoldenExample],
    serve: ServeModel,
    gen: GenerationConfig,
    generate: Generate = generate_with_progress,
    *,
    schemas: Sequence[str] | None = None,
    log: AnswerLog | None = None,
) -> list[dict[str, Any]]:
    """One Phase-D setting: π1's schemas, then π2's tables on the valid ones; one record per example
    (``schema_prediction``, ``table_prediction`` or None, whether each stopped at the token limit
    (``schema_truncated``, ``table_truncated``), whether the executor refused it and why (``schema_refused``,
    ``schema_refusal``, ``table_refused``, ``table_refusal``), the prompts' hashes, the models).

    ``schemas``: π1's schemas from a Stage 1 already run (:func:`stage1_schemas`, shared by the settings
    with this π1); then Stage 1 is not run again and π1 is not served. ``log``: the setting's answers kept so
    far (only the others are asked), and where each new one is kept."""
    if schemas is not None and len(schemas) != len(examples):
        raise ValueError(f"schemas: {len(schemas)} for {len(examples)} examples")
    s1 = [build_stage1_messages(ex.text) for ex in examples]
    if schemas is None:
        schemas = stage1_schemas(setting, pi1, examples, serve, gen, generate, log=log)
    template = stage2_template()
    s2 = {
        i: prompt
        for i, (ex, schema) in enumerate(zip(examples, schemas, strict=True))
        if (prompt := stage2_on_prediction(ex.text, schema, template)) is not None
    }
    where = f"setting {setting!r}, Stage 2 (π2 {pi2})"
    tables = answer_stage("stage2", where, pi2, examples, s2, serve, gen, generate, f"{setting} π2 tables", log)
    return [
        {
            "id": ex.id,
            "setting": setting,
            "schema_prediction": schemas[i],
            "table_prediction": tables.get(i),
            "schema_truncated": truncated(schemas[i]),
            "table_truncated": truncated(tables[i]) if i in tables else None,
            "schema_refused": refusal(schemas[i]) is not None,
            "schema_refusal": refusal(schemas[i]),
            "table_refused": refusal(tables[i]) is not None if i in tables else None,
            "table_refusal": refusal(tables[i]) if i in tables else None,
            "stage1_messages_sha256": messages_hash(s1[i]),
            "stage2_messages_sha256": messages_hash(s2[i]) if i in s2 else None,
            "schema_model": pi1,
            "table_model": pi2,
            "prompt_version": PROMPT_VERSION,
        }
        for i, ex in enumerate(examples)
    ]

"""Every recipe's Phase D part, on the run's servers: each π1 writes its schemas once for the settings that share
it, kept under ``stage1_cache/`` with the key of what produced them (:mod:`trainer.evaluation.stage1_cache`: a Phase D
cut short does not redo them), then each setting's π2 writes its tables on them; scored and written by
:mod:`trainer.evaluation.phase_d`, and recorded.

Every answer is kept as it arrives, in an answer log under the same key (:mod:`trainer.evaluation.answer_log`):
π1's beside its schemas (``stage1_cache/answers/<setting>.jsonl``), each setting's tables in
``phase_d_answers/<setting>.jsonl``; a Phase D stopped by a dead executor asks, when run again, only what it lacks.
A prompt an executor refuses (HTTP 400) is that document's outcome, counted and limited by
``--eval-max-refused-share``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.golden import sha256_file
from trainer.evaluation import two_stage
from trainer.runs.context import first_error
from trainer.runs.record import read_json
from trainer.serving.identity import fingerprint

if TYPE_CHECKING:
    from shared import GoldenExample
    from trainer.evaluation.answer_log import AnswerLog
    from trainer.evaluation.generation import GenerationConfig
    from trainer.evaluation.phase_d import EvalOutputs
    from trainer.evaluation.two_stage import PromptStage, ServeModel
    from trainer.runs.config import RunConfig
    from trainer.runs.context import RunContext
    from trainer.serving.endpoint import Endpoint, ServingMode
    from trainer.serving.executors import ModelSpec
    from trainer.serving.gpus import ExecutorSlot

# Phase D's scores are reused only for the same key (the loop's and the experiments' rule): beside metrics.json.
EVAL_KEY = "eval_key.json"


@dataclass(frozen=True)
class EvalSet:
    """The documents a Phase D scores: a split of the golden folder, one source's only where ``source`` is set, the
    first ``limit`` of them. The recipes' Phase D is the test split whole (``--eval-limit``); a choice made before
    training scores a validation split (:mod:`trainer.runs.sft_choice`)."""

    split: str = "test"
    source: str | None = None
    limit: int | None = None
    per_source: bool = False  # the limit counts each source's documents (else the split's, in file order)

    def file(self, golden: Path) -> Path:
        from shared.golden import golden_filename

        return golden / golden_filename(self.split)

    def read(self, golden: Path) -> list[GoldenExample]:
        from shared import read_golden
        from shared.golden import source_of

        if self.source is None and not self.per_source:
            return read_golden(self.file(golden), self.limit)
        taken: dict[str, int] = {}
        found = []
        for ex in read_golden(self.file(golden)):
            src = source_of(ex.id)
            if self.source not in (None, src) or (self.limit is not None and taken.get(src, 0) >= self.limit):
                continue
            taken[src] = taken.get(src, 0) + 1
            found.append(ex)
        return found

    def key(self, golden: Path) -> dict[str, Any]:
        """What the scores depend on of the documents; the test split whole keeps the recipes' first key."""
        if self.split == "test" and self.source is None and not self.per_source:
            return {"test": sha256_file(self.file(golden))}
        return {self.split: sha256_file(self.file(golden)), "source": self.source, "limit": self.limit,
                "per_source": self.per_source}  # fmt: skip


def eval_key(
    cfg: RunConfig, settings: Mapping[str, tuple[str, str]], eval_set: EvalSet | None = None
) -> dict[str, Any]:
    """What Phase D's scores depend on: every setting's model contents, the documents (the test file, or
    ``eval_set``), the generation settings."""
    from shared import PROMPT_VERSION

    return {
        "settings": {name: [fingerprint(pi1), fingerprint(pi2)] for name, (pi1, pi2) in settings.items()},
        "golden": (eval_set or EvalSet()).key(cfg.golden),
        "config": {
            "eval_limit": cfg.eval_limit, "max_tokens": cfg.eval_max_tokens, "prompt_version": PROMPT_VERSION,
            "concurrency": cfg.eval_concurrency,
            "serving": {"eager": cfg.executor_eager, "prefix_caching": cfg.executor_prefix_caching},
        },
    }  # fmt: skip


def eval_key_difference(out: Path, key: Mapping[str, Any]) -> str | None:
    """None when ``out`` holds Phase D's scores for ``key``; else what differs, each with both values."""
    if read_json(out / "metrics.json") is None:
        return "no scores"
    from trainer.runs.reuse import inputs_difference

    recorded = read_json(out / EVAL_KEY)
    if not isinstance(recorded, dict):
        return f"no {EVAL_KEY} beside its scores"
    return inputs_difference(recorded, dict(key)) or None


def record_eval_key(out: Path, key: Mapping[str, Any]) -> None:
    (out / EVAL_KEY).write_text(json.dumps(key, indent=2) + "\n")


# (the settings that share a π1, that π1) -> where its schemas are kept and the key they are kept under
Keep = Callable[[Sequence[str], str], tuple[Path, dict[str, Any]]]
# a setting -> where its Stage-2 answers are kept as they come, and their key
KeepTables = Callable[[str], tuple[Path, dict[str, Any]]]


def by_pi1(settings: Mapping[str, tuple[str, str]]) -> dict[str, list[str]]:
    """Each π1 model with the settings that use it, in the settings' order."""
    groups: dict[str, list[str]] = {}
    for name, (pi1, _pi2) in settings.items():
        groups.setdefault(pi1, []).append(name)
    return groups


def score_settings(
    settings: Mapping[str, tuple[str, str]],
    examples: Sequence[GoldenExample],
    gen: GenerationConfig,
    serve: Callable[[str], ServeModel],
    keep: Keep,
    *,
    together: bool,
    say: Callable[[str], None] = print,
    on_stage1: Callable[[Mapping[str, Sequence[str]]], None] | None = None,
    keep_tables: KeepTables | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every setting's two-stage records (settings → (π1, π2) models; ``serve(setting)`` serves its models).

    ``together``: every Stage 1 and Stage 2 at once, one thread each (a setting's Stage 2 waits for its π1's
    schemas in its own thread); else one after another, each π1's Stage 1 and then its settings' Stage 2, so
    that one model is served at a time. ``on_stage1`` gets each setting's schemas as soon as every Stage 1 has
    ended (a recipe scores them before Stage 2 ends, so a Phase D cut short still has them). π1's answers are kept
    as they come beside its schemas (``answers/<schemas' name>.jsonl``, same key); ``keep_tables``: where each setting's
    Stage-2 answers are kept (none: not kept)."""
    runs = _TwoStageRuns(settings, examples, gen, serve, keep, say, keep_tables)
    return runs.all_at_once(on_stage1) if together else runs.one_after_another(on_stage1)


@dataclass
class _TwoStageRuns:
    """:func:`score_settings`' Stage 1 of each π1 (once for the settings that share it) and Stage 2 of each
    setting, with the answer logs they continue from."""

    settings: Mapping[str, tuple[str, str]]
    examples: Sequence[GoldenExample]
    gen: GenerationConfig
    serve: Callable[[str], ServeModel]
    keep: Keep
    say: Callable[[str], None]
    keep_tables: KeepTables | None
    groups: dict[str, list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.groups = by_pi1(self.settings)

    def stage1(self, pi1: str) -> list[str]:
        from trainer.evaluation.stage1_cache import cached_stage1

        names = self.groups[pi1]
        label = "+".join(names)
        path, key = self.keep(names, pi1)

        def write() -> list[str]:
            log = self.opened(path.parent / "answers" / f"{path.stem}.jsonl", key, f"{label}: π1's")
            return two_stage.stage1_schemas(
                label, pi1, self.examples, self.serve(names[0]), self.gen, two_stage.generate_quietly, log=log
            )

        schemas, kept = cached_stage1(path, key, write)
        if kept:
            self.say(f"[phase D] {label}: π1's schemas from an earlier run of this evaluation ({path})")
        return schemas

    def opened(self, path: Path, key: Mapping[str, Any], what: str) -> AnswerLog:
        from trainer.evaluation.answer_log import AnswerLog

        log = AnswerLog.open(path, key)
        if log.changed:
            self.say(
                f"[phase D] {what} answers in {path} were generated otherwise, starting over: {'; '.join(log.changed)}"
            )
        elif len(log):
            self.say(f"[phase D] {what} answers: {len(log)} kept from an earlier run ({path})")
        return log

    def stage2(self, name: str, schemas: list[str]) -> list[dict[str, Any]]:
        pi1, pi2 = self.settings[name]
        log = self.opened(*self.keep_tables(name), f"{name}: π2's") if self.keep_tables is not None else None
        return two_stage.run_two_stage(
            name,
            pi1,
            pi2,
            self.examples,
            self.serve(name),
            self.gen,
            two_stage.generate_quietly,
            schemas=schemas,
            log=log,
        )

    def each_setting(self, schemas: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        return {name: list(schemas[pi1]) for name, (pi1, _pi2) in self.settings.items()}

    def one_after_another(
        self, on_stage1: Callable[[Mapping[str, Sequence[str]]], None] | None
    ) -> dict[str, list[dict[str, Any]]]:
        """Each π1's Stage 1, then its settings' Stage 2: one model served at a time."""
        out: dict[str, list[dict[str, Any]]] = {}
        written: dict[str, list[str]] = {}
        for pi1, names in self.groups.items():
            written[pi1] = self.stage1(pi1)
            if on_stage1 is not None and len(written) == len(self.groups):
                on_stage1(self.each_setting(written))
            out.update({name: self.stage2(name, written[pi1]) for name in names})
        return {name: out[name] for name in self.settings}

    def all_at_once(
        self, on_stage1: Callable[[Mapping[str, Sequence[str]]], None] | None
    ) -> dict[str, list[dict[str, Any]]]:
        """Every Stage 1 and Stage 2 in its own thread; a setting's Stage 2 waits for its π1's schemas."""
        with ThreadPoolExecutor(max_workers=len(self.groups) + len(self.settings)) as pool:
            firsts = {pi1: pool.submit(self.stage1, pi1) for pi1 in self.groups}
            seconds = {
                name: pool.submit(lambda n: self.stage2(n, firsts[self.settings[n][0]].result()), name)
                for name in self.settings
            }
            if on_stage1 is not None:
                first_error(list(firsts.values()))
                on_stage1(self.each_setting({pi1: f.result() for pi1, f in firsts.items()}))
            first_error(list(seconds.values()))
            return {name: seconds[name].result() for name in self.settings}


def placed(
    ctx: RunContext, settings: Mapping[str, tuple[str, str]], tag: str
) -> tuple[Callable[[str, str], ModelSpec], int | None]:
    """How a Phase D of ``settings`` serves its models (``spec(setting, model)``, logs ``executor_<tag>_...``) and in
    waves of how many settings: side by side, one GPU each, at most one per GPU; on CPU one model at a time (None)."""
    from trainer.serving.executors import ModelSpec

    slots: dict[str, ExecutorSlot | None] = dict.fromkeys(settings)
    waves = None
    if ctx.plan is not None:
        gpu_slots = ctx.plan.eval_slots(len(settings))
        slots = {name: gpu_slots[i % len(gpu_slots)] for i, name in enumerate(settings)}
        waves = len(gpu_slots)

    def spec(name: str, model: str) -> ModelSpec:
        stage = "pi1" if model == settings[name][0] else "pi2"
        return ModelSpec(model, slot=slots[name], log=ctx.logs / f"executor_{tag}_{name}_{stage}.log")

    return spec, waves


def generation(cfg: RunConfig) -> GenerationConfig:
    """The run's own requests: greedy, ``--eval-max-tokens``, ``--eval-concurrency``, ``--eval-timeout-s``."""
    from trainer.evaluation.generation import GenerationSettings

    return GenerationSettings(max_tokens=cfg.eval_max_tokens, concurrency=cfg.eval_concurrency,
                              timeout_s=cfg.eval_timeout_s).config()  # fmt: skip


def test_examples(cfg: RunConfig) -> list[GoldenExample]:
    return EvalSet(limit=cfg.eval_limit).read(cfg.golden)


@dataclass
class Scored:
    """Every setting's records, and how its executors served (π1's; π1 and π2 are served alike)."""

    records: dict[str, list[dict[str, Any]]]
    modes: dict[str, ServingMode | None]


def score(
    ctx: RunContext, settings: Mapping[str, tuple[str, str]], examples: Sequence[GoldenExample],
    spec: Callable[[str, str], ModelSpec], *, waves: int | None,
    on_stage1: Callable[[Mapping[str, Sequence[str]]], None] | None = None, eval_set: EvalSet | None = None,
    kept_under: str = "",
) -> Scored:  # fmt: skip
    """The settings' records on the run's servers (``spec(setting, model)``: how to serve a model of a setting).
    ``waves`` None: one model served at a time, the settings in turn (CPU); else the settings in waves of at most
    ``waves``, every model of a wave served at once and its stages run together (the last wave's held on).
    ``examples`` are ``eval_set``'s (default: the test split, ``--eval-limit``), which keys π1's kept schemas;
    ``kept_under``: a subfolder of the kept schemas and tables (a recipe with several Phase Ds of one setting name)."""
    from trainer.evaluation.stage1_cache import stage1_key
    from trainer.serving.identity import fingerprint

    gen, modes = generation(ctx.cfg), dict[str, 'ServingMode | None']()
    docs = eval_set or EvalSet(limit=ctx.cfg.eval_limit)
    test_file = docs.file(ctx.cfg.golden)
    eps: dict[str, Endpoint] = {}

    def serve(name: str) -> ServeModel:
        @contextlib.contextmanager
        def served(model: str, stage: PromptStage) -> Iterator[Endpoint]:
            if model not in eps:  # one at a time: the one before stops first
                ctx.servers.pool.stop_except([])
                eps.clear()
                eps[model] = ctx.servers.serve([spec(name, model)])[0]
            modes.setdefault(name, eps[model].mode)
            yield eps[model]

        return served

    # how the servers serve (every executor of the run alike): schemas repeat only in one mode
    cfg = ctx.cfg
    serving = {"profile": cfg.profile, "eager": cfg.executor_eager, "prefix_caching": cfg.executor_prefix_caching}

    def keep(names: Sequence[str], pi1: str) -> tuple[Path, dict[str, Any]]:
        key = stage1_key(fingerprint(pi1), test_file, docs.limit, gen, serving)
        if docs.source is not None or docs.per_source:
            key |= {"source": docs.source, "per_source": docs.per_source}
        return ctx.root / "stage1_cache" / kept_under / f"{names[0]}.json", key

    def keep_tables(name: str) -> tuple[Path, dict[str, Any]]:
        pi1, pi2 = settings[name]
        key = {"setting": name, "table_model": fingerprint(pi2), **keep([name], pi1)[1]}
        return ctx.root / "phase_d_answers" / kept_under / f"{name}.jsonl", key

    if waves is None:
        records = score_settings(settings, examples, gen, serve, keep, together=False, say=ctx.say,
                                 on_stage1=on_stage1, keep_tables=keep_tables)  # fmt: skip
        ctx.servers.pool.stop_except([])
        return Scored(records, modes)
    records = {}
    names = list(settings)
    for i in range(0, len(names), waves):
        if i:  # the wave before gives its GPUs back
            ctx.servers.pool.stop_except([])
            eps.clear()
        wave = {name: settings[name] for name in names[i : i + waves]}
        wanted = [(name, model) for name, pair in wave.items() for model in dict.fromkeys(pair)]
        eps.update(zip([m for _n, m in wanted], ctx.servers.serve([spec(n, m) for n, m in wanted]), strict=True))
        modes.update({name: eps[pi1].mode for name, (pi1, _pi2) in wave.items()})
        hook = on_stage1 if len(names) <= waves else None  # the schemas of every setting at once: one wave only
        records.update(score_settings(wave, examples, gen, serve, keep, together=True, say=ctx.say, on_stage1=hook,
                                      keep_tables=keep_tables))  # fmt: skip
    return Scored(records, modes)


def write(
    ctx: RunContext, tag: str, out: Path, settings: Mapping[str, Any], examples: Sequence[GoldenExample],
    predictions: Mapping[str, Sequence[Mapping[str, Any]]], modes: Mapping[str, ServingMode | None], title: str,
    **decide: Any,
) -> EvalOutputs:  # fmt: skip
    """Scores, report and plots of ``predictions`` in ``out`` (``decide``: the decision's metric, gain and pair),
    recorded under ``phase_d[tag]`` and in the run's report."""
    from trainer.evaluation.phase_d import write_outputs

    cfg = ctx.cfg
    res = write_outputs(
        out, examples, predictions, title, max_tokens=cfg.eval_max_tokens, serving=modes,
        max_truncated_share=cfg.eval_max_truncated_share, concurrency=cfg.eval_concurrency,
        max_refused_share=cfg.eval_max_refused_share, **decide,
    )  # fmt: skip
    ctx.record.phase_d(tag, out, dict(settings), res.decision)
    ctx.record.write_report()
    ctx.say(f"{title}: {res.report}")
    return res

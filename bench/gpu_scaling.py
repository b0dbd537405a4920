"""Executor scale-out: one reward_api in front of 1, 2, 4 … vLLM executors (each on its own GPU).

    python -m bench gpu-scaling (--executor-url URL [--executor-url URL ...] | --serve-model DIR [--gpus 0,1,2,3])
        [--model NAME] [--replicas 1,2,4] [--workers 1,4,8] [--api-replicas 1] [--items 2000] [--clients 16]
        [--batch 32]

The executors are started once (``--serve-model``: one vLLM per GPU, ``bench.common.gpu_executor_urls``;
or already running at the URLs) and reused; only reward_api is restarted per configuration, its executor
URLs set to the first ``r`` URLs and ``--workers w`` uvicorn workers; ``--api-replicas k`` starts ``k`` such reward_api
processes (each with ``w`` workers, as replicas behind a load balancer would be) and spreads the clients
over them round-robin. Load: distinct Stage-2 prompts from the golden
test split, each a pipeline item whose prediction is the gold schema (so the prompt is exactly what a
good π1 makes), ``max_tokens`` from the gold NDJSON lengths; ``clients`` concurrent clients post
batches of ``batch`` items to ``/reward/pipeline`` (cache off: every item is one executor call).

Per configuration: pipeline items/s, executor generated tokens/s, p50/p99 request latency and the share
of items per replica, from each executor's own ``/metrics`` (``vllm:request_success_total``).
Goal: ≥ 1.8× items/s at 2 executors and ≥ 3.4× at 4, against 1, in the same run (each
replica count at its best worker count; the table shows every worker count).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    bench_reward_api_settings,
    golden_dir,
    header_md,
    md_table,
    met,
    percentile,
    run_record,
    write_result,
)
from shared import PROMPT_VERSION, GoldenExample, canonical_schema_json, gold_ndjson, read_split
from shared.wire import PipelineRequest
from trainer.reward_client import AsyncRewardClient, build_request

NAME = "gpu_scaling"
GOALS = {2: 1.8, 4: 3.4}
VLLM_DONE = "vllm:request_success_total"
VLLM_GEN_TOKENS = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class Config:
    replicas: int
    workers: int
    api_replicas: int = 1

    @property
    def label(self) -> str:
        api = f"{self.api_replicas} reward_api × " if self.api_replicas > 1 else ""
        return f"{self.replicas} exec × {api}{self.workers} workers"


def default_replicas(n_urls: int) -> list[int]:
    """1, 2, 4 … executors, up to the number there are."""
    return [r for r in (1, 2, 4, 8, 16, 32) if r <= n_urls]


def plan(
    replicas: Sequence[int], workers: Sequence[int], n_urls: int, api_replicas: Sequence[int] = (1,)
) -> list[Config]:
    """Every (replicas, reward_api replicas, workers) triple, executor replicas outer so the table reads
    by executor count."""
    bad = [r for r in replicas if r < 1 or r > n_urls]
    if bad:
        raise ValueError(f"--replicas {bad}: only {n_urls} executor URL(s) given")
    if any(w < 1 for w in workers):
        raise ValueError("--workers: every worker count must be ≥ 1")
    if any(k < 1 for k in api_replicas):
        raise ValueError("--api-replicas: every reward_api replica count must be ≥ 1")
    return [
        Config(r, w, k) for r in sorted(set(replicas)) for k in sorted(set(api_replicas)) for w in sorted(set(workers))
    ]


def reward_api_settings(urls: Sequence[str], model: str, max_tokens: int, max_in_flight: int) -> dict[str, Any]:
    """reward_api settings for one configuration: cache off, so every item costs one executor call."""
    return bench_reward_api_settings(urls, model, max_tokens, max_in_flight, executor_timeout_s=600, deadline_s=1800)


def build_items(examples: Sequence[GoldenExample], n: int) -> list[dict[str, Any]]:
    """``n`` pipeline items over distinct documents, the prediction being the gold schema."""
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for ex in examples:
        if ex.text in seen:
            continue
        seen.add(ex.text)
        schema = ex.schema_dict()
        items.append(
            {
                "id": f"{ex.id}#{len(items)}",
                "prediction": canonical_schema_json(schema),
                "text": ex.text,
                "gold_schema": schema,
                "gold_table": ex.table_dict(),
            }
        )
        if len(items) == n:
            break
    if len(items) < n:
        raise ValueError(f"only {len(items)} distinct documents in the split, {n} asked for")
    return items


def realistic_max_tokens(items: Sequence[dict[str, Any]], count_tokens: Any = None, q: float = 99.0) -> int:
    """max_tokens that lets the gold NDJSON of ``q``% of the items through, with 25% headroom (rounded
    up to 16). ``count_tokens`` is the served model's tokenizer; without it, 3.5 characters a token."""
    counts = [
        int(count_tokens(gold_ndjson(it["gold_table"])))
        if count_tokens
        else math.ceil(len(gold_ndjson(it["gold_table"])) / 3.5)
        for it in items
    ]
    return int(math.ceil(percentile(counts, q) * 1.25 / 16) * 16)


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of counter ``name`` (all label sets) in a Prometheus text page."""
    family = name[: -len("_total")] if name.endswith("_total") else name
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            total += sum(s.value for s in fam.samples if s.name == name)
    return total


def scrape(urls: Sequence[str]) -> list[dict[str, float]]:
    out = []
    with httpx.Client(timeout=10) as client:
        for u in urls:
            text = client.get(f"{u.rstrip('/')}/metrics").text
            out.append({"done": metric_sum(text, VLLM_DONE), "gen_tokens": metric_sum(text, VLLM_GEN_TOKENS)})
    return out


def shares(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> list[float]:
    """Each replica's share of the requests it finished between two scrapes."""
    done = [a["done"] - b["done"] for a, b in zip(after, before, strict=True)]
    total = sum(done)
    return [round(d / total, 4) if total else 0.0 for d in done]


def client_urls(api_urls: str | Sequence[str], clients: int) -> list[str]:
    """The reward_api URL of each client: round-robin over the replicas."""
    urls = [api_urls] if isinstance(api_urls, str) else list(api_urls)
    if not urls:
        raise ValueError("no reward_api URL")
    return [urls[i % len(urls)] for i in range(clients)]


async def _load(
    api_urls: str | Sequence[str], items: list[dict[str, Any]], clients: int, batch: int
) -> tuple[float, list[float], int]:
    """``clients`` concurrent clients take batches off one queue until it is empty; client ``i`` posts to
    reward_api replica ``i mod k`` through the typed reward client (answers checked, prompt version too)."""
    queue: asyncio.Queue[PipelineRequest] = asyncio.Queue()
    for i in range(0, len(items), batch):
        queue.put_nowait(build_request("pipeline", items[i : i + batch]))
    latencies: list[float] = []
    failed = 0

    async def client(reward: AsyncRewardClient) -> None:
        nonlocal failed
        while not queue.empty():
            request = queue.get_nowait()
            t0 = time.perf_counter()
            answer = await reward.score(request)
            latencies.append(time.perf_counter() - t0)
            failed += answer.failed

    urls = client_urls(api_urls, clients)
    connections = clients + 4
    rewards = {u: AsyncRewardClient(u, PROMPT_VERSION, timeout_s=1800.0, max_connections=connections) for u in urls}
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(rewards[u]) for u in urls))
        return time.perf_counter() - t0, latencies, failed
    finally:
        for reward in rewards.values():
            await reward.aclose()


def measure(
    cfg: Config,
    urls: Sequence[str],
    model: str,
    items: list[dict[str, Any]],
    warmup: list[dict[str, Any]],
    max_tokens: int,
    clients: int,
    batch: int,
    max_in_flight: int,
) -> dict[str, Any]:
    from trainer.serving.reward_api import reward_api_process

    used = list(urls[: cfg.replicas])
    settings = reward_api_settings(used, model, max_tokens, max_in_flight)
    with contextlib.ExitStack() as stack:
        apis = [
            stack.enter_context(reward_api_process(None, workers=cfg.workers, **settings))
            for _ in range(cfg.api_replicas)
        ]
        api_urls = [a.url for a in apis]
        asyncio.run(_load(api_urls, warmup, clients, max(1, len(warmup) // clients)))  # connections, first calls
        before = scrape(used)
        seconds, lat, failed = asyncio.run(_load(api_urls, items, clients, batch))
        after = scrape(used)
    # Totals over distinct servers (a URL listed twice is one server, scraped twice).
    distinct = {u.rstrip("/"): i for i, u in enumerate(used)}.values()
    gen = sum(after[i]["gen_tokens"] - before[i]["gen_tokens"] for i in distinct)
    done = sum(after[i]["done"] - before[i]["done"] for i in distinct)
    return {
        "replicas": cfg.replicas,
        "workers": cfg.workers,
        "api_replicas": cfg.api_replicas,
        "items": len(items),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(items) / seconds, 2),
        "executor_tokens_per_s": round(gen / seconds, 1),
        "generated_tokens_per_item": round(gen / len(items), 1),
        "executor_requests": int(done),
        "p50_ms": round(percentile(lat, 50) * 1000, 1),
        "p99_ms": round(percentile(lat, 99) * 1000, 1),
        "mean_ms": round(statistics.fmean(lat) * 1000, 1),
        "failed": failed,
        "share_per_replica": shares(before, after),
    }


def goals_from(rows: Sequence[dict[str, Any]]) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """Best items/s per replica count and the speed-up goals against 1 replica."""
    best: dict[int, float] = {}
    for r in rows:
        best[r["replicas"]] = max(best.get(r["replicas"], 0.0), r["items_per_s"])
    goals = []
    base = best.get(1)
    for n, target in GOALS.items():
        if base and n in best:
            ratio = best[n] / base
            goals.append(
                {
                    "goal": f"items/s at {n} executors ≥ {target}× 1 executor",
                    "value": round(ratio, 2),
                    "target": target,
                    "met": ratio >= target,
                }
            )
    return best, goals


def same_setting_speedups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """items/s at n executors over 1 executor at the SAME reward_api setting (replicas × workers), for every
    setting measured at both: the goal compares best rates, this shows how much the setting moves it."""
    base = {(r.get("api_replicas", 1), r["workers"]): r["items_per_s"] for r in rows if r["replicas"] == 1}
    out = []
    for r in rows:
        key = (r.get("api_replicas", 1), r["workers"])
        if r["replicas"] > 1 and base.get(key):
            out.append(
                {
                    "executors": r["replicas"],
                    "reward_api": f"{key[0]} × {key[1]}",
                    "speedup": round(r["items_per_s"] / base[key], 2),
                }
            )
    return out


def rerender(path: Path) -> str:
    """The Markdown report of a recorded JSON result, with goals and same-setting speed-ups recomputed
    from its rows (reports written before those sections existed read the same as new ones)."""
    p = json.loads(Path(path).read_text())
    return render_md(p | derived(p["rows"]))


def derived(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a report computes from its rows: best items/s per executor count, the goals, the same-setting
    speed-ups."""
    best, goals = goals_from(rows)
    return {
        "best_items_per_s": {str(k): v for k, v in sorted(best.items())},
        "goals": goals,
        "speedup_same_setting": same_setting_speedups(rows),
    }


def report(
    rows: list[dict[str, Any]],
    record: dict[str, Any],
    setup: dict[str, Any],
    quick: bool,
    plot: bool = True,
) -> dict[str, Any]:
    payload = {"benchmark": NAME, "run": record, **setup, "rows": rows, **derived(rows)}
    write_result(NAME, payload, render_md(payload), quick)
    if plot:
        render_png(payload, quick)
    return payload


def render_md(p: dict[str, Any]) -> str:
    md = header_md("Executor scale-out: reward_api over 1/2/4 vLLM executors, each on its own GPU", p["run"])
    gpu = p.get("gpu") or {}
    md += (
        f"- GPUs: {gpu.get('count', '?')} × {gpu.get('name', '?')}; vLLM {p['run']['versions'].get('vllm')}; "
        f"model `{p['model']}`\n"
        f"- load: {p['items']} distinct Stage-2 prompts (golden test split, prediction = gold schema), "
        f"max_tokens {p['max_tokens']} (gold NDJSON p99 + 25%), temperature 0; {p['clients']} concurrent "
        f"clients, {p['batch']} items per request; reward_api cache off, MAX_IN_FLIGHT {p['max_in_flight']} "
        "per worker\n\n"
    )
    md += "## Goals\n\n" + md_table(
        ["goal", "value", "target", "result"], [[g["goal"], g["value"], g["target"], met(g["met"])] for g in p["goals"]]
    )
    md += "\n## Every configuration\n\n" + md_table(
        [
            "executors",
            "reward_api × workers",
            "items/s",
            "exec tokens/s",
            "tokens/item",
            "p50 ms",
            "p99 ms",
            "failed",
            "share per replica",
        ],
        [
            [
                r["replicas"],
                f"{r.get('api_replicas', 1)} × {r['workers']}",
                r["items_per_s"],
                r["executor_tokens_per_s"],
                r["generated_tokens_per_item"],
                r["p50_ms"],
                r["p99_ms"],
                r["failed"],
                " / ".join(f"{s:.2f}" for s in r["share_per_replica"]),
            ]
            for r in p["rows"]
        ],
    )
    same = p.get("speedup_same_setting") or []
    if same:
        md += "\n## Speed-up at the same reward_api setting\n\n" + md_table(
            ["executors", "reward_api × workers", "items/s over 1 executor"],
            [[x["executors"], x["reward_api"], x["speedup"]] for x in same],
        )
    md += "\n" + bottleneck_note(p["rows"]) + "\n"
    return md


def bottleneck_note(rows: Sequence[dict[str, Any]]) -> str:
    """Where the limit sits: if more reward_api workers (over all reward_api replicas) raise items/s at an
    executor count, reward_api was the limit."""
    lines = []
    for n in sorted({r["replicas"] for r in rows}):
        by_w = sorted(
            (r["workers"] * r.get("api_replicas", 1), r["items_per_s"], f"{r.get('api_replicas', 1)} × {r['workers']}")
            for r in rows
            if r["replicas"] == n
        )
        if len(by_w) < 2:
            continue
        lo, hi = by_w[0], max(by_w, key=lambda x: x[1])
        gain = hi[1] / lo[1] if lo[1] else float("nan")
        where = "reward_api (more workers help)" if gain >= 1.15 else "the executors (more workers do not help)"
        lines.append(
            f"- {n} executor(s): best at {hi[0]} worker(s) in all (reward_api {hi[2]}), {gain:.2f}× the rate "
            f"with {lo[0]} ({lo[2]}): the limit is {where}."
        )
    return "## Where the limit is\n\n" + ("\n".join(lines) if lines else "- one worker count only") + "\n"


def render_png(p: dict[str, Any], quick: bool) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS_DIR

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, w in sorted({(r.get("api_replicas", 1), r["workers"]) for r in p["rows"]}):
        pts = sorted(
            (r["replicas"], r["items_per_s"]) for r in p["rows"] if (r.get("api_replicas", 1), r["workers"]) == (k, w)
        )
        name = f"reward_api {k} × {w} worker(s)" if k > 1 else f"reward_api {w} worker(s)"
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
    base = p["best_items_per_s"].get("1")
    if base:
        xs = sorted(int(k) for k in p["best_items_per_s"])
        ax.plot(xs, [base * x for x in xs], ls=":", color="grey", label="linear from 1 executor")
    ax.set_xlabel("vLLM executors (one GPU each)")
    ax.set_ylabel("pipeline items/s")
    ax.set_title("Pipeline reward scale-out")
    ax.legend()
    ax.grid(alpha=0.3)
    out = RESULTS_DIR / (f"{NAME}.quick.png" if quick else f"{NAME}.png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def gpu_info() -> dict[str, Any]:
    try:
        import torch

        if torch.cuda.is_available():
            return {
                "count": torch.cuda.device_count(),
                "name": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
            }
    except Exception:
        pass
    return {}


def run(
    urls: Sequence[str],
    model: str,
    golden: str | Path | None = None,
    replicas: Sequence[int] = (1, 2, 4),
    workers: Sequence[int] = (1, 4, 8),
    n_items: int = 2000,
    clients: int = 16,
    batch: int = 32,
    max_in_flight: int = 256,
    max_tokens: int | None = None,
    tokenizer: str | None = None,
    quick: bool = False,
    api_replicas: Sequence[int] = (1,),
) -> dict[str, Any]:
    configs = plan(replicas, workers, len(urls), api_replicas)
    record = run_record(quick)
    examples = read_split(golden_dir(golden), "test")
    warm_n = min(64, n_items)
    pool = build_items(examples, n_items + warm_n)
    items, warmup = pool[:n_items], pool[n_items:]
    if max_tokens is None:
        count = None
        if tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(tokenizer)

            def count(s: str) -> int:
                return len(tok(s)["input_ids"])

        max_tokens = realistic_max_tokens(items, count)
    setup = {
        "executor_urls": list(urls),
        "model": model,
        "items": n_items,
        "max_tokens": max_tokens,
        "clients": clients,
        "batch": batch,
        "max_in_flight": max_in_flight,
        "gpu": gpu_info(),
    }
    rows: list[dict[str, Any]] = []
    for cfg in configs:
        row = measure(cfg, urls, model, items, warmup, max_tokens, clients, batch, max_in_flight)
        print(f"[{NAME}] {cfg.label}: {row['items_per_s']} items/s, shares {row['share_per_replica']}", flush=True)
        rows.append(row)
        # Written after every configuration: a run cut off by a time limit still leaves its rows.
        report(rows, record, setup, quick, plot=False)
    return report(rows, record, setup, quick)

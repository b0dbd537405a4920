"""Benchmark 1: local rewards in-process (``shared.compute_*``) vs through HTTP (1 and N workers).

Same items, same configs, same run. The HTTP side includes everything a caller pays: JSON encoding of
the request, the round trip, decoding the answer. Every HTTP answer is checked against the in-process
rewards (same ids, same order, same values), so a fast wrong answer cannot pass.
Goal (docs/benchmarks.md): at batch 1024, HTTP ≥ 0.7× in-process for schema and table (1 worker vs 1 process).
Beside it (informational): N workers against 1 worker, both driven by N concurrent clients.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Timing,
    golden_dir,
    header_md,
    load_examples,
    md_table,
    met,
    perturb_schema,
    perturb_table,
    run_record,
    write_result,
)
from shared import (
    PROMPT_VERSION,
    GoldenExample,
    SchemaRewardConfig,
    TableRewardConfig,
    compute_schema_reward_single,
    compute_table_reward_single,
)
from trainer.reward_client import RewardClient, RewardRequest, build_request

BATCH_SIZES = (1, 64, 1024)
GOAL_RATIO = 0.7
KINDS = ("schema", "table")


def build_items(examples: list[GoldenExample], kind: str, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    if kind == "schema":
        return [
            {"id": f"{ex.id}#{i}", "prediction": perturb_schema(ex, rng), "gold_schema": ex.schema_dict()}
            for i, ex in enumerate(examples)
        ]
    return [
        {"id": f"{ex.id}#{i}", "prediction": perturb_table(ex, rng), "gold_table": ex.table_dict()}
        for i, ex in enumerate(examples)
    ]


def in_process_rewards(kind: str, items: list[dict[str, Any]]) -> list[float]:
    """What a caller writes without the service: a loop over ``shared.compute_*_single``."""
    if kind == "schema":
        scfg = SchemaRewardConfig()
        return [compute_schema_reward_single(it["prediction"], it["gold_schema"], scfg).reward for it in items]
    tcfg = TableRewardConfig()
    return [compute_table_reward_single(it["prediction"], it["gold_table"], tcfg).reward for it in items]


def _batches(items: list[dict[str, Any]], size: int, n_batches: int) -> list[list[dict[str, Any]]]:
    # Wrap around the item pool so every batch is full and n_batches is exact.
    out = []
    for b in range(n_batches):
        start = (b * size) % len(items)
        batch = [items[(start + j) % len(items)] for j in range(size)]
        out.append(batch)
    return out


def time_in_process(kind: str, batches: list[list[dict[str, Any]]]) -> tuple[Timing, list[list[float]]]:
    in_process_rewards(kind, batches[0])  # warm-up (imports, caches)
    lat, rewards = [], []
    t0 = time.perf_counter()
    for batch in batches:
        s = time.perf_counter()
        rewards.append(in_process_rewards(kind, batch))
        lat.append(time.perf_counter() - s)
    return Timing(sum(map(len, batches)), time.perf_counter() - t0, lat), rewards


class Mismatch(AssertionError):
    """An HTTP answer differs from the in-process rewards (count, order or value)."""


def time_http(
    url: str, kind: str, batches: list[list[dict[str, Any]]], expected: list[list[float]], concurrency: int
) -> Timing:
    """``concurrency`` client threads share the batches; each checks its answers against ``expected``.

    Each client first posts one untimed warm-up request (connection, first-request costs); the clock
    starts once all of them are warm, as ``time_in_process`` warms up before its clock starts. (Until
    this was fixed, the warm-up counted in the elapsed time but not in the items: 9 requests timed for
    8 batches' items at batch 1024, which understated the HTTP rate by 1/9.)
    """
    endpoint = f"{url}/reward/{kind}"
    # Built (and validated) before the clock: the timed part is what every caller pays, encode, POST, parse.
    requests = [build_request(kind, batch) for batch in batches]  # type: ignore[call-overload]
    lat: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    next_i = iter(range(len(batches)))
    warm = threading.Barrier(concurrency + 1)

    def post(client: RewardClient, request: RewardRequest, want: list[float]) -> None:
        # the typed client checks the status, the count, the order and the prompt version
        got = [r.reward for r in client.score(request).results]
        if any(abs(g - w) > 1e-9 for g, w in zip(got, want, strict=True)):
            raise Mismatch(f"{endpoint}: rewards differ from in-process")

    def worker() -> None:
        with RewardClient(url, PROMPT_VERSION, timeout_s=300.0) as client:
            try:
                post(client, requests[0], expected[0])  # warm-up, untimed
                warm.wait()
            except threading.BrokenBarrierError:  # another client's warm-up failed
                return
            except BaseException as exc:
                errors.append(exc)
                warm.abort()
                return
            while True:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                s = time.perf_counter()
                try:
                    post(client, requests[i], expected[i])
                except BaseException as exc:
                    errors.append(exc)
                    return
                with lock:
                    lat.append(time.perf_counter() - s)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a warm-up failed: its error is raised below
        warm.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return Timing(sum(map(len, batches)), elapsed, lat)


def plan(quick: bool) -> dict[int, int]:
    """Batches per batch size: enough items for a stable rate, fewer with --quick."""
    return {1: 100, 64: 10, 1024: 2} if quick else {1: 1000, 64: 60, 1024: 8}


def _median_round(timings: list[Timing]) -> dict[str, Any]:
    """The round with the median throughput; latency percentiles over all rounds' requests."""
    ordered = sorted(timings, key=lambda t: t.items / t.seconds)
    mid = ordered[len(ordered) // 2].as_dict()
    pooled = Timing(mid["items"], mid["seconds"], [x for t in timings for x in t.latencies_s]).as_dict()
    per_round = [round(t.items / t.seconds, 2) for t in timings]  # in round order, for paired ratios
    return {
        **mid,
        "p50_ms": pooled["p50_ms"],
        "p99_ms": pooled["p99_ms"],
        "rounds": len(timings),
        "round_items_per_s": per_round,
    }


def paired_ratios(num: dict[str, Any], den: dict[str, Any]) -> list[float]:
    """``num``'s rate over ``den``'s, round by round: both ran in the same round, seconds apart, so a slow
    stretch of the machine hits both (the goal's value divides the two medians, which need not pair)."""
    return [round(a / b, 3) for a, b in zip(num["round_items_per_s"], den["round_items_per_s"], strict=True)]


def run(
    golden: str | Path | None = None, quick: bool = False, workers: int = 2, seed: int = 0, repeats: int | None = None
) -> dict[str, Any]:
    from trainer.serving.reward_api import reward_api_process

    record = run_record(quick)
    examples = load_examples(golden_dir(golden), 1024 if quick else 3000, seed=seed)
    counts = plan(quick)
    repeats = repeats or (1 if quick else 3)
    rows: list[dict[str, Any]] = []
    servers = {n: reward_api_process(None, workers=n, log_level="WARNING") for n in (1, workers)}
    try:
        for s in servers.values():
            s.start(timeout=120)
        for kind in KINDS:
            items = build_items(examples, kind, seed)
            for size in BATCH_SIZES:
                batches = _batches(items, size, counts[size])
                # Modes alternate within each round, so a burst of load from elsewhere hits all of them.
                rounds: dict[str, list[Timing]] = {}
                for _ in range(repeats):
                    base, expected = time_in_process(kind, batches)
                    rounds.setdefault("in-process", []).append(base)
                    for n, server in servers.items():
                        t = time_http(server.url, kind, batches, expected, concurrency=n)
                        rounds.setdefault(f"http-{n}w", []).append(t)
                    if workers > 1:  # the same N clients against 1 worker: what the extra workers add
                        t = time_http(servers[1].url, kind, batches, expected, concurrency=workers)
                        rounds.setdefault(f"http-1w-{workers}c", []).append(t)
                for mode, timings in rounds.items():
                    rows.append({"kind": kind, "batch": size, "mode": mode, **_median_round(timings)})
    finally:
        for s in servers.values():
            s.stop()
    goals = []
    for kind in KINDS:
        ip = next(r for r in rows if r["kind"] == kind and r["batch"] == 1024 and r["mode"] == "in-process")
        for mode in ("http-1w", f"http-{workers}w"):
            h = next(r for r in rows if r["kind"] == kind and r["batch"] == 1024 and r["mode"] == mode)
            ratio = h["items_per_s"] / ip["items_per_s"]
            # The goal compares one server process with one in-process loop; N workers is reported beside it.
            goals.append(
                {
                    "goal": f"{kind} batch 1024: {mode} ≥ {GOAL_RATIO}× in-process",
                    "value": round(ratio, 3),
                    "target": GOAL_RATIO,
                    "met": ratio >= GOAL_RATIO,
                    "binding": mode == "http-1w",
                    "per_round": paired_ratios(h, ip),
                }
            )
        at_1024 = {r["mode"]: r for r in rows if r["kind"] == kind and r["batch"] == 1024}
        one, many = at_1024.get(f"http-1w-{workers}c"), at_1024[f"http-{workers}w"]
        if one is not None:
            goals.append(
                {
                    "goal": f"{kind} batch 1024, {workers} clients: {workers} workers vs 1 worker (scaling, no target)",
                    "value": round(many["items_per_s"] / one["items_per_s"], 3),
                    "target": None,
                    "met": True,
                    "binding": False,
                    "per_round": paired_ratios(many, one),
                }
            )
    payload = {
        "benchmark": "local_rewards",
        "run": record,
        "workers": workers,
        "repeats": repeats,
        "rows": rows,
        "goals": goals,
    }
    png = _plot(rows, quick)
    payload["plot"] = png.name if png else None
    write_result("local_rewards", payload, render_md(payload), quick)
    return payload


def render_md(p: dict[str, Any]) -> str:
    md = header_md("Local rewards: in-process vs HTTP", p["run"])
    md += (
        "Same perturbed golden items on both sides; every HTTP answer was checked against the in-process "
        "rewards (ids, order, values). HTTP time includes client-side JSON encoding and decoding; one warm-up "
        "batch per side (per client) runs before the clock starts; "
        "`http-Nw` = N uvicorn workers driven by N concurrent clients; `http-1w-Nc` = 1 worker driven by the same "
        "N clients (the baseline of the workers row). "
        f"Median of {p['repeats']} alternating rounds per row (p50/p99 over all rounds).\n\n"
    )
    md += "## Goals\n\n" + md_table(
        ["goal", "value", "target", "binding", "result", "per round (paired)"],
        [
            [g["goal"], g["value"], g["target"], "yes" if g["binding"] else "info", _result(g), _per_round(g)]
            for g in p["goals"]
        ],
    )
    md += (
        "\nvalue: the median round's items/s over the median round's items/s (the goal's definition); per round: "
        "the same ratio within each round, whose modes ran seconds apart.\n"
    )
    md += "\n## Throughput and latency\n\n" + md_table(
        ["kind", "batch", "mode", "items", "items/s", "p50 ms", "p99 ms"],
        [[r["kind"], r["batch"], r["mode"], r["items"], r["items_per_s"], r["p50_ms"], r["p99_ms"]] for r in p["rows"]],
    )
    if p.get("plot"):
        md += f"\n![throughput vs batch size]({p['plot']})\n"
    return md


def _per_round(goal: dict[str, Any]) -> str:
    return " / ".join(str(x) for x in goal.get("per_round", []))


def _result(goal: dict[str, Any]) -> str:
    return met(goal["met"]) if goal["target"] is not None else "(measured)"


def _plot(rows: list[dict[str, Any]], quick: bool) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from bench.common import RESULTS_DIR

    fig, axes = plt.subplots(1, len(KINDS), figsize=(10, 4))
    for ax, kind in zip(axes, KINDS, strict=True):
        for mode in sorted({r["mode"] for r in rows}):
            pts = sorted((r["batch"], r["items_per_s"]) for r in rows if r["kind"] == kind and r["mode"] == mode)
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("items/s")
        ax.set_title(f"{kind} reward")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / ("local_rewards.quick.png" if quick else "local_rewards.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

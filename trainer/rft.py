"""RFT baseline (rejection-sampling fine-tuning), trained and evaluated beside the RL phases.

For every training prompt: sample ``k`` outputs from a served policy (one OpenAI request with
``n=k``), score all of them through the reward API (the same rewards as RL), keep the best one if
its reward is ≥ ``threshold``, and write the kept pairs as an SFT parquet (``messages`` column)
under ``<out>/data/<a1|a2>/train.parquet`` (validation: the gold SFT rows). Training then reuses
the SFT launcher (phase A1 for Stage 1, A2 for Stage 2); the exported model is compared with the
RL policies by ``trainer evaluate pipeline --setting rft=...``.

Rewards (the reward kinds of :mod:`trainer.registry.phases`): ``schema`` (π1, schema reward), ``pipeline``
(π1, pipeline reward via the executor), ``table`` (π2 on gold schemas, table reward).

``per_source`` draws the prompts: ``{"wikitabletext": 2000, "e2e": 500}`` takes that many training examples of
each named source (all of a smaller one), by ``seed``, in file order; sources left out are not sampled.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shared import GoldenExample, read_golden
from shared.golden import source_of
from shared.split_overlap import train_examples
from trainer.data.datasets import SFT_SCHEMA, sft_row, write_parquet
from trainer.evaluation.generation import GenerationClient, GenerationConfig, GenerationSettings, truncated
from trainer.evaluation.reward_scoring import prompt_for, reward_item, score
from trainer.registry.phases import RewardKind, sft_phase_for


@dataclass(frozen=True)
class RftConfig:
    k: int = 4
    threshold: float = 0.5
    temperature: float = 1.0
    # the trainer's generation settings (one default each); concurrency counts requests of k samples each
    max_tokens: int = GenerationSettings.max_tokens
    concurrency: int = GenerationSettings.concurrency
    timeout_s: float = GenerationSettings.timeout_s
    seed: int = 0
    # keep a prompt's best sample only where its reward beats the policy's greedy answer's (the greedy baseline's
    # rule: only what evaluation would not already write is learnt)
    beat_greedy: bool = False
    # the gold SFT row of every drawn prompt joins the kept samples (RFT continues SFT instead of replacing it)
    with_gold: bool = False

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [-1, 1], got {self.threshold}")


@dataclass
class RftReport:
    reward: str
    prompts: int
    samples: int
    kept: int
    mean_best_reward: float
    threshold: float
    train_file: str
    truncated: int = 0  # samples cut at max_tokens: never kept (a cut answer is no demonstration)
    prompts_all_cut: int = 0  # prompts none of whose samples ended before max_tokens
    prompts_per_source: dict[str, int] | None = None
    kept_per_source: dict[str, int] | None = None
    mean_best_reward_per_source: dict[str, float] | None = None
    mean_greedy_reward_per_source: dict[str, float] | None = None  # with beat_greedy
    not_above_greedy: int = 0  # prompts whose best sample reached the threshold but not above greedy
    gold_rows: int = 0  # with with_gold

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def select_best(rewards: Sequence[float], threshold: float) -> int | None:
    """Index of the highest reward if it reaches ``threshold`` (first on ties), else None."""
    if not rewards:
        return None
    best = max(range(len(rewards)), key=lambda i: (rewards[i], -i))
    return best if rewards[best] >= threshold else None


def parse_per_source(text: str) -> dict[str, int]:
    """``"wikitabletext=2000,e2e=500"`` → ``{"wikitabletext": 2000, "e2e": 500}``; a bad part is named."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"per-source: {part!r} is not SOURCE=N with N >= 1 (e.g. wikitabletext=2000,e2e=500)")
        if name.strip() in out:
            raise ValueError(f"per-source: {name.strip()!r} is named twice")
        out[name.strip()] = int(count)
    return out


def sample_per_source(
    examples: Sequence[GoldenExample], per_source: Mapping[str, int], seed: int
) -> list[GoldenExample]:
    """``per_source[src]`` examples of each named source (all where it has fewer), drawn with ``seed``, kept in
    file order; a named source with no example is an error naming the sources there are."""
    by_source: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by_source.setdefault(source_of(ex.id), []).append(i)
    missing = sorted(set(per_source) - set(by_source))
    if missing:
        raise ValueError(f"per-source: no training example of {missing}; the sources are {sorted(by_source)}")
    rng = random.Random(seed)
    chosen: list[int] = []
    for src in sorted(per_source):
        idx = by_source[src]
        chosen += idx if per_source[src] >= len(idx) else rng.sample(idx, per_source[src])
    return [examples[i] for i in sorted(chosen)]


def _per_source_mean(ids: Sequence[str], values: Sequence[float]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for i, v in zip(ids, values, strict=True):
        sums.setdefault(source_of(i), []).append(v)
    return {src: round(sum(v) / len(v), 4) for src, v in sorted(sums.items())}


def _counts(ids: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(source_of(i) for i in ids).items()))


def _greedy_rewards(
    examples: Sequence[GoldenExample],
    prompts: Sequence[Any],
    reward: RewardKind,
    policy_url: str,
    model: str,
    reward_url: str,
    sampling: GenerationConfig,
) -> list[float]:
    """The reward of the policy's greedy answer to every prompt (what evaluation would get), scored the same way."""
    gen = replace(sampling, temperature=0.0)
    with tqdm(total=len(prompts), desc=f"RFT greedy answers ({reward})", unit="prompt") as bar:
        answers = asyncio.run(GenerationClient(policy_url, model, gen).generate(prompts, on_done=lambda: bar.update(1)))
    items = [reward_item(reward, ex, f"{ex.id}#greedy", a) for ex, a in zip(examples, answers, strict=True)]
    return score(reward_url, reward, items)


@dataclass
class _Selection:
    """Of every prompt's samples, the best one kept (as an SFT row), and what was left out and why."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    best_rewards: list[float] = field(default_factory=list)
    best_ids: list[str] = field(default_factory=list)
    kept_ids: list[str] = field(default_factory=list)
    cut: int = 0
    all_cut: int = 0
    not_above: int = 0


def _sample(
    prompts: Sequence[Any], reward: RewardKind, policy_url: str, model: str, cfg: RftConfig
) -> tuple[GenerationConfig, list[list[str]]]:
    """``cfg.k`` samples of the policy per prompt, and the generation settings they were drawn with."""
    gen = GenerationConfig(
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
        timeout_s=cfg.timeout_s,
    )
    with tqdm(total=len(prompts), desc=f"RFT samples ({reward}, k {cfg.k})", unit="prompt") as bar:
        client = GenerationClient(policy_url, model, gen)
        samples = asyncio.run(client.sample(prompts, cfg.k, on_done=lambda: bar.update(1)))
    return gen, samples


def _select(
    examples: Sequence[GoldenExample],
    prompts: Sequence[Any],
    samples: Sequence[Sequence[str]],
    rewards: Sequence[float],
    greedy_rewards: Sequence[float] | None,
    threshold: float,
) -> _Selection:
    """Per prompt, the best whole sample ≥ ``threshold`` (and above the greedy answer's reward where given)."""
    sel = _Selection()
    pos = 0
    for i, (ex, prompt, outs) in enumerate(zip(examples, prompts, samples, strict=True)):
        rs = rewards[pos : pos + len(outs)]
        pos += len(outs)
        whole = [j for j, o in enumerate(outs) if not truncated(o)]  # a cut answer is no demonstration
        sel.cut += len(outs) - len(whole)
        sel.all_cut += not whole
        best = select_best([rs[j] for j in whole], threshold)
        idx = whole[best] if best is not None else None
        if idx is not None and greedy_rewards is not None and rs[idx] <= greedy_rewards[i]:
            idx = None
            sel.not_above += 1
        if rs:
            sel.best_rewards.append(max(rs))
            sel.best_ids.append(ex.id)
        if idx is not None:
            sel.rows.append({"messages": [*prompt, {"role": "assistant", "content": outs[idx]}], "id": f"{ex.id}#rft"})
            sel.kept_ids.append(ex.id)
    return sel


def _report(
    reward: RewardKind,
    examples: Sequence[GoldenExample],
    samples: int,
    sel: _Selection,
    cfg: RftConfig,
    train: Path,
    greedy_rewards: Sequence[float] | None,
    gold_rows: int,
) -> RftReport:
    return RftReport(
        reward=reward,
        prompts=len(examples),
        samples=samples,
        kept=len(sel.rows),
        mean_best_reward=round(sum(sel.best_rewards) / max(len(sel.best_rewards), 1), 4),
        threshold=cfg.threshold,
        train_file=str(train),
        truncated=sel.cut,
        prompts_all_cut=sel.all_cut,
        prompts_per_source=_counts(ex.id for ex in examples),
        kept_per_source=_counts(sel.kept_ids),
        mean_best_reward_per_source=_per_source_mean(sel.best_ids, sel.best_rewards),
        mean_greedy_reward_per_source=_per_source_mean([ex.id for ex in examples], greedy_rewards)
        if greedy_rewards is not None
        else None,
        not_above_greedy=sel.not_above,
        gold_rows=gold_rows,
    )


def build_rft_data(
    golden: Path,
    out: Path,
    reward: RewardKind,
    policy_url: str,
    model: str,
    reward_url: str,
    cfg: RftConfig,
    limit: int | None = None,
    per_source: Mapping[str, int] | None = None,
) -> RftReport:
    """Sample, score, keep the best ≥ threshold; write ``out/data/<a1|a2>/{train,validation}.parquet``. The train
    documents that repeat a validation or test document are left out, as ``data build`` leaves them out."""
    examples = train_examples(golden, limit)
    if per_source:
        examples = sample_per_source(examples, per_source, cfg.seed)
    prompts = [prompt_for(reward, ex) for ex in examples]

    gen, samples = _sample(prompts, reward, policy_url, model, cfg)
    items = [
        reward_item(reward, ex, f"{ex.id}#{j}", s)
        for ex, outs in zip(examples, samples, strict=True)
        for j, s in enumerate(outs)
    ]
    rewards = score(reward_url, reward, items)
    greedy_rewards = (
        _greedy_rewards(examples, prompts, reward, policy_url, model, reward_url, gen) if cfg.beat_greedy else None
    )
    sel = _select(examples, prompts, samples, rewards, greedy_rewards, cfg.threshold)
    phase = sft_phase_for(reward)
    train = out / "data" / phase / "train.parquet"
    if not sel.rows:
        why = f" ({sel.cut} of {len(items)} samples were cut at max_tokens {cfg.max_tokens})" if sel.cut else ""
        above = f"; {sel.not_above} reached it without beating the greedy answer" if sel.not_above else ""
        raise ValueError(
            f"RFT kept no sample above threshold {cfg.threshold}{why}{above}: lower --threshold, raise --k or "
            "--max-tokens"
        )
    gold = [sft_row(phase, ex) for ex in examples] if cfg.with_gold else []
    write_parquet([*sel.rows, *gold], train, SFT_SCHEMA)
    val_examples = read_golden(golden / "common_validation_schemas.jsonl", limit)
    write_parquet([sft_row(phase, ex) for ex in val_examples], out / "data" / phase / "validation.parquet", SFT_SCHEMA)
    report = _report(reward, examples, len(items), sel, cfg, train, greedy_rewards, len(gold))
    (out / "rft_report.json").write_text(json.dumps({**report.as_dict(), "config": asdict(cfg)}, indent=2) + "\n")
    return report

"""Before a long GRPO run: will its groups teach anything? (the advantage check of issue 12)

GRPO's advantage of a sample is its reward minus its group's mean, over the group's spread. A group
whose ``n`` samples all score the same has advantage 0 for every sample: it adds nothing to the
gradient. Once SFT is good (or the temperature is low, or the reward saturates) most groups can be
like that, and a run of many GPU-minutes then moves nothing. This check samples ``n`` outputs for a
few training prompts from the start policy, scores them through reward_api exactly as the phase
will, and reports the share of *informative* groups (rewards not all equal). It fails when that
share is below ``min_informative``.

    python -m trainer preflight --golden DIR --stage schema --policy-url URL --policy-model NAME \\
        --reward-url URL [--n 8] [--prompts 32] [--temperature 1.0] [--min-informative 0.25]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shared import read_golden
from trainer.evaluation.executor_client import ExecutorClient, GenerationConfig
from trainer.rft import Stage, prompt_for, reward_item, score

# Which reward each GRPO phase trains on (its data_source), hence which stage to sample.
PHASE_STAGE: dict[str, Stage] = {"b1": "schema", "b2": "table", "c1": "pipeline", "c2": "table"}
EQUAL = 1e-9  # rewards closer than this count as equal (GRPO's std would be ~0)


@dataclass(frozen=True)
class PreflightReport:
    stage: str
    prompts: int
    n: int
    temperature: float
    informative_groups: int
    informative_share: float
    mean_reward: float
    mean_group_std: float
    min_informative: float
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_stats(rewards: Sequence[Sequence[float]]) -> tuple[int, float, float]:
    """(groups whose rewards differ, mean reward, mean within-group population std)."""
    if not rewards or any(len(g) < 2 for g in rewards):
        raise ValueError("group_stats: every group needs at least 2 samples")
    informative = sum(1 for g in rewards if max(g) - min(g) > EQUAL)
    mean = statistics.fmean(r for g in rewards for r in g)
    spread = statistics.fmean(statistics.pstdev(g) for g in rewards)
    return informative, mean, spread


def advantage_check(
    golden: Path,
    stage: Stage,
    policy_url: str,
    model: str,
    reward_url: str,
    *,
    n: int = 8,
    prompts: int = 32,
    temperature: float = 1.0,
    max_tokens: int = 512,
    min_informative: float = 0.25,
    seed: int = 0,
) -> PreflightReport:
    """Sample ``n`` outputs for ``prompts`` random training prompts; score; count informative groups."""
    if n < 2:
        raise ValueError(f"n must be >= 2 (a group of one has no spread), got {n}")
    examples = read_golden(golden / "common_train_schemas.jsonl")
    picked = random.Random(seed).sample(examples, min(prompts, len(examples)))
    gen = GenerationConfig(max_tokens=max_tokens, temperature=temperature, seed=seed)
    samples = asyncio.run(ExecutorClient(policy_url, model, gen).sample([prompt_for(stage, ex) for ex in picked], n))
    items = [reward_item(stage, ex, f"{ex.id}#{j}", s) for ex, outs in zip(picked, samples, strict=True)
             for j, s in enumerate(outs)]  # fmt: skip
    flat = score(reward_url, stage, items)
    groups = [flat[i * n : (i + 1) * n] for i in range(len(picked))]
    informative, mean, spread = group_stats(groups)
    share = informative / len(groups)
    return PreflightReport(
        stage=stage,
        prompts=len(groups),
        n=n,
        temperature=temperature,
        informative_groups=informative,
        informative_share=round(share, 4),
        mean_reward=round(mean, 4),
        mean_group_std=round(spread, 4),
        min_informative=min_informative,
        ok=share >= min_informative,
    )


def write_report(report: PreflightReport | TemperatureChoice, path: Path) -> None:
    """A preflight report, or the temperature chosen from a sweep of them, as JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")


@dataclass(frozen=True)
class TemperatureChoice:
    """The rollout temperature chosen from a preflight sweep, and why."""

    temperature: float
    reached: bool  # every phase has at least ``min_share`` informative groups at ``temperature``
    min_share: float
    reason: str
    # temperature -> phase -> (informative share, mean reward), as read from the sweep
    sweep: dict[float, dict[str, tuple[float, float]]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "reached": self.reached,
            "min_share": self.min_share,
            "reason": self.reason,
            "sweep": {
                str(t): {ph: {"informative_share": s, "mean_reward": m} for ph, (s, m) in row.items()}
                for t, row in self.sweep.items()
            },
        }


def read_sweep(folder: Path, phases: Sequence[str]) -> dict[float, dict[str, tuple[float, float]]]:
    """``<phase>_t<temperature>.json`` reports (``write_report``'s format) of ``phases`` in ``folder``:
    temperature -> phase -> (informative share, mean reward). Only temperatures that every phase was
    checked at are kept."""
    by_t: dict[float, dict[str, tuple[float, float]]] = {}
    for phase in phases:
        for path in sorted(folder.glob(f"{phase}_t*.json")):
            try:
                rep = json.loads(path.read_text())
                t = float(rep["temperature"])
                by_t.setdefault(t, {})[phase] = (float(rep["informative_share"]), float(rep["mean_reward"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: not a preflight report ({exc})") from None
    complete = {t: row for t, row in by_t.items() if set(row) == set(phases)}
    if not complete:
        found = sorted(p.name for p in folder.glob("*_t*.json"))
        raise ValueError(f"{folder}: no temperature with a report for every phase of {list(phases)} (found {found})")
    return dict(sorted(complete.items()))


def choose_temperature(sweep: dict[float, dict[str, tuple[float, float]]], min_share: float) -> TemperatureChoice:
    """The lowest temperature at which every phase has at least ``min_share`` informative groups: the
    samples closest to the policy's own that still give GRPO a gradient. If none reaches it, the
    temperature with the highest worst-phase share (ties: the lower temperature), marked not reached.
    Training prompts only: nothing here looks at the validation or test split."""
    if not sweep:
        raise ValueError("choose_temperature: empty sweep")
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share: must be in [0, 1], got {min_share}")
    worst = {t: min(share for share, _ in row.values()) for t, row in sweep.items()}
    for t in sorted(sweep):
        if worst[t] >= min_share:
            return TemperatureChoice(
                t, True, min_share, f"lowest temperature with every phase >= {min_share:.0%} informative groups "
                f"(worst phase {worst[t]:.0%})", sweep,
            )  # fmt: skip
    best = max(sorted(sweep), key=lambda t: worst[t])
    return TemperatureChoice(
        best, False, min_share, f"no temperature reaches {min_share:.0%} informative groups in every phase; "
        f"the best worst-phase share is {worst[best]:.0%}", sweep,
    )  # fmt: skip

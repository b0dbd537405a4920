"""Before a long GRPO run: what can GRPO use from the start policy? (the advantage check, and the headroom over greedy)

GRPO's advantage of a sample is its reward minus its group's mean (over the group's spread, unless
Dr.GRPO). A group whose ``n`` samples all score the same adds nothing to the gradient. But a group
that merely differs is not enough either: a group of 8 where one sample is worse than the other 7
only sharpens the mode the policy already greedily emits. What moves the greedy answer is a sample
that **beats** it. So, per source (``shared.golden.source_of``) and on training prompts only, for
``n`` samples per prompt at one temperature plus one greedy (temperature 0) answer, all scored
through reward_api exactly as the phase will:

- informative share: prompts whose ``n`` rewards are not all equal;
- **improvable share**: prompts whose best sample beats the greedy answer by more than ``EQUAL``;
- best-of-n − greedy: the mean over prompts of ``max(samples) − greedy``;
- invalid share: samples the reward API could not parse (``valid_json`` false).

The headline is the macro mean over sources (each source counts once, whatever its size). A phase
whose macro improvable share is below ``min_improvable`` has **no headroom**: it is reported as such
and not run blind. The improvable prompts' ids go into the report, and ``improvable_prompt_set``
writes them as a prompt set in the phase's RLHFDataset format (offline difficulty filtering).

    python -m trainer preflight --golden DIR --phase b1 --policy-url URL --policy-model NAME \\
        --reward-url URL [--n N] [--prompts N] [--temperature 1.0] [--min-improvable 0.10]

How much it samples (:class:`PreflightSize`) has one default, for that command, the loop's ``--preflight-min`` and
the experiments' sweep.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pyarrow.parquet as pq

from shared import GoldenExample
from shared.golden import source_of
from shared.split_overlap import train_examples
from trainer.config_cli import option
from trainer.data.train_set import rl_row_ids
from trainer.evaluation.generation import GenerationClient, GenerationConfig, GenerationSettings
from trainer.evaluation.reward_scoring import prompt_for, reward_item, score_results
from trainer.registry.phases import RewardKind

EQUAL = 1e-9  # rewards closer than this count as equal (GRPO's std would be ~0)
# Default headroom threshold: below 10% of prompts whose best sample beats greedy (macro over sources),
# GRPO mostly sharpens the mode it already has (measured: E2E/RotoWire sit near 0, WikiTableText well above).
MIN_IMPROVABLE = 0.10
Criterion = Literal["improvable", "informative"]
# Calls in flight to the policy's executor: sampling requests of n completions each, and greedy ones.
# A concurrency of 16 (the client's default then) kept 16 x n 16 = 256 sequences running (a quarter of the 1,024
# vLLM runs at once on a >= 70 GiB GPU) and sent 600 greedy prompts in ~40 waves of 16 (measured on GPU nodes).
SAMPLE_REQUESTS_IN_FLIGHT = 64
GREEDY_IN_FLIGHT = 256


@dataclass(frozen=True, kw_only=True)
class PreflightSize:
    """How much the preflight samples: ``prompts`` training prompts of each source, ``n`` samples each (plus one
    greedy answer). One default for ``trainer preflight``, the loop's ``--preflight-min`` and the experiments' sweep
    (their ``--preflight-prompts`` / ``--preflight-n`` are these fields).

    Why 16 x 64: ``n`` is the phase's ``rollout.n``, and the gpu profile's is 16 (``configs/profile/gpu.yaml``: 8 was
    the recipe before it), so the preflight measures the groups the phase will train on; a group of 8 has fewer
    chances of a sample that beats greedy and understates the headroom. 64 prompts per source: the size
    docs/training.md's recipe runs; they hold a 10% improvable share to about +-4 points (binomial standard error),
    where 32 give +-5.
    """

    n: int = option(16, "Samples per prompt (the phase's rollout.n).", min=2)
    prompts: int = option(64, "Training prompts to sample per source.", min=1)


@dataclass(frozen=True)
class PromptOutcome:
    """One training prompt of the preflight: the greedy answer's reward and the ``n`` samples' rewards."""

    id: str
    greedy: float
    samples: tuple[float, ...]
    samples_valid: tuple[bool, ...]
    greedy_valid: bool = True

    def __post_init__(self) -> None:
        if len(self.samples) < 2:
            raise ValueError(f"{self.id}: a group needs at least 2 samples, got {len(self.samples)}")
        if len(self.samples_valid) != len(self.samples):
            raise ValueError(f"{self.id}: {len(self.samples_valid)} validity flags for {len(self.samples)} samples")

    @property
    def source(self) -> str:
        return source_of(self.id)

    @property
    def informative(self) -> bool:
        return max(self.samples) - min(self.samples) > EQUAL

    @property
    def improvable(self) -> bool:
        return max(self.samples) > self.greedy + EQUAL

    @property
    def best_minus_greedy(self) -> float:
        return max(self.samples) - self.greedy


@dataclass(frozen=True)
class HeadroomStats:
    """What GRPO can use, over a set of prompts (one source, or the macro mean over sources)."""

    prompts: int
    informative_share: float
    improvable_share: float
    best_minus_greedy: float
    invalid_share: float  # of the n samples per prompt
    greedy_invalid_share: float
    mean_reward: float  # of the samples
    greedy_reward: float
    mean_group_std: float

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def headroom_stats(outcomes: Sequence[PromptOutcome]) -> HeadroomStats:
    """The statistics of ``outcomes`` pooled (use :func:`per_source` / :func:`macro` for sources)."""
    if not outcomes:
        raise ValueError("headroom_stats: no prompts")
    k = len(outcomes)
    samples = [r for o in outcomes for r in o.samples]
    valid = [v for o in outcomes for v in o.samples_valid]
    return HeadroomStats(
        prompts=k,
        informative_share=sum(o.informative for o in outcomes) / k,
        improvable_share=sum(o.improvable for o in outcomes) / k,
        best_minus_greedy=statistics.fmean(o.best_minus_greedy for o in outcomes),
        invalid_share=1.0 - sum(valid) / len(valid),
        greedy_invalid_share=1.0 - sum(o.greedy_valid for o in outcomes) / k,
        mean_reward=statistics.fmean(samples),
        greedy_reward=statistics.fmean(o.greedy for o in outcomes),
        mean_group_std=statistics.fmean(statistics.pstdev(o.samples) for o in outcomes),
    )


def per_source(outcomes: Iterable[PromptOutcome]) -> dict[str, HeadroomStats]:
    by: dict[str, list[PromptOutcome]] = {}
    for o in outcomes:
        by.setdefault(o.source, []).append(o)
    return {src: headroom_stats(group) for src, group in sorted(by.items())}


def macro(stats: Mapping[str, HeadroomStats]) -> HeadroomStats:
    """Each source counts once (RotoWire's 23k training documents do not drown WikiTableText's 10k)."""
    if not stats:
        raise ValueError("macro: no sources")
    vals = list(stats.values())

    def mean(name: str) -> float:
        return statistics.fmean(float(getattr(s, name)) for s in vals)

    return HeadroomStats(
        prompts=sum(s.prompts for s in vals),
        **{f: mean(f) for f in HeadroomStats.__dataclass_fields__ if f != "prompts"},
    )


def group_stats(rewards: Sequence[Sequence[float]]) -> tuple[int, float, float]:
    """(groups whose rewards differ, mean reward, mean within-group population std)."""
    if not rewards or any(len(g) < 2 for g in rewards):
        raise ValueError("group_stats: every group needs at least 2 samples")
    informative = sum(1 for g in rewards if max(g) - min(g) > EQUAL)
    mean = statistics.fmean(r for g in rewards for r in g)
    spread = statistics.fmean(statistics.pstdev(g) for g in rewards)
    return informative, mean, spread


@dataclass(frozen=True)
class PreflightReport:
    """One phase at one temperature. The shares, the gain and the rewards are macro means over sources
    (``per_source`` holds each); ``prompts`` and ``informative_groups`` are counts over all of them."""

    reward: str
    prompts: int
    n: int
    temperature: float
    informative_groups: int
    informative_share: float
    mean_reward: float
    mean_group_std: float
    min_informative: float
    ok: bool
    improvable_share: float = 0.0
    best_minus_greedy: float = 0.0
    invalid_share: float = 0.0
    greedy_reward: float = 0.0
    min_improvable: float = 0.0
    headroom: bool = True
    no_headroom_sources: list[str] = field(default_factory=list)
    per_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    improvable_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def verdict(self) -> str:
        """One plain line: what GRPO can use here, and whether the phase should run."""
        where = f"{self.reward} at temperature {self.temperature}"
        if not self.headroom:
            return (
                f"NO HEADROOM: {where}: the best of {self.n} samples beats the greedy answer on "
                f"{self.improvable_share:.0%} of prompts (macro over sources) < {self.min_improvable:.0%}; "
                "GRPO would only sharpen the greedy answer. Do not run this phase blind."
            )
        if self.informative_share < self.min_informative:
            return (
                f"TOO LITTLE SIGNAL: {where}: only {self.informative_groups}/{self.prompts} groups of {self.n} "
                f"samples have rewards that differ ({self.informative_share:.0%} < {self.min_informative:.0%}): "
                "GRPO would learn little."
            )
        weak = f"; no headroom in {', '.join(self.no_headroom_sources)}" if self.no_headroom_sources else ""
        return (
            f"headroom: {where}: {self.improvable_share:.0%} improvable prompts, best-of-{self.n} − greedy "
            f"{self.best_minus_greedy:+.3f}, {self.invalid_share:.0%} invalid samples{weak}"
        )


def build_report(
    reward: str,
    outcomes: Sequence[PromptOutcome],
    temperature: float,
    *,
    min_informative: float = 0.0,
    min_improvable: float = MIN_IMPROVABLE,
) -> PreflightReport:
    """The report of ``outcomes`` (pure: every number of the preflight comes from here)."""
    if not outcomes:
        raise ValueError("build_report: no prompts")
    n = len(outcomes[0].samples)
    sources = per_source(outcomes)
    head = macro(sources)
    headroom = head.improvable_share >= min_improvable
    return PreflightReport(
        reward=reward,
        prompts=len(outcomes),
        n=n,
        temperature=temperature,
        informative_groups=sum(o.informative for o in outcomes),
        informative_share=round(head.informative_share, 4),
        mean_reward=round(head.mean_reward, 4),
        mean_group_std=round(head.mean_group_std, 4),
        min_informative=min_informative,
        ok=headroom and head.informative_share >= min_informative,
        improvable_share=round(head.improvable_share, 4),
        best_minus_greedy=round(head.best_minus_greedy, 4),
        invalid_share=round(head.invalid_share, 4),
        greedy_reward=round(head.greedy_reward, 4),
        min_improvable=min_improvable,
        headroom=headroom,
        no_headroom_sources=[src for src, st in sources.items() if st.improvable_share < min_improvable],
        per_source={src: st.as_dict() for src, st in sources.items()},
        improvable_ids=[o.id for o in outcomes if o.improvable],
    )


def sample_per_source(
    examples: Sequence[GoldenExample], per_source: int, seed: int = 0, sources: Sequence[str] | None = None
) -> list[GoldenExample]:
    """A seeded random ``per_source`` examples of each source (all of a smaller one), sources sorted."""
    by: dict[str, list[GoldenExample]] = {}
    for ex in examples:
        by.setdefault(source_of(ex.id), []).append(ex)
    if sources is not None:
        unknown = sorted(set(sources) - set(by))
        if unknown:
            raise ValueError(f"sources {unknown} have no training example (found {sorted(by)})")
        by = {s: by[s] for s in sources}
    rng = random.Random(seed)
    return [ex for src in sorted(by) for ex in rng.sample(by[src], min(per_source, len(by[src])))]


def advantage_check(
    golden: Path,
    reward: RewardKind,
    policy_url: str,
    model: str,
    reward_url: str,
    *,
    n: int = PreflightSize.n,
    prompts: int = PreflightSize.prompts,
    temperature: float = 1.0,
    max_tokens: int = GenerationSettings.max_tokens,
    min_informative: float = 0.25,
    min_improvable: float = MIN_IMPROVABLE,
    sources: Sequence[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    sample_in_flight: int = SAMPLE_REQUESTS_IN_FLIGHT,
    greedy_in_flight: int = GREEDY_IN_FLIGHT,
) -> PreflightReport:
    """Sample ``n`` outputs and one greedy answer for ``prompts`` random training prompts of each source (of the
    first ``limit`` training documents less those that repeat a held-out document: those a data build with ``--limit``
    kept) (at most ``sample_in_flight``
    sampling and ``greedy_in_flight`` greedy requests at once); score them all through reward_api; report what GRPO
    can use (:func:`build_report`)."""
    if n < 2:
        raise ValueError(f"n must be >= 2 (a group of one has no spread), got {n}")
    picked = sample_per_source(train_examples(golden, limit), prompts, seed, sources)
    messages = [prompt_for(reward, ex) for ex in picked]
    hot = GenerationConfig(max_tokens=max_tokens, temperature=temperature, seed=seed, concurrency=sample_in_flight)
    samples = asyncio.run(GenerationClient(policy_url, model, hot).sample(messages, n))
    greedy_cfg = GenerationConfig(max_tokens=max_tokens, temperature=0.0, seed=seed, concurrency=greedy_in_flight)
    greedy = asyncio.run(GenerationClient(policy_url, model, greedy_cfg).generate(messages))
    items = [reward_item(reward, ex, f"{ex.id}#{j}", s) for ex, outs in zip(picked, samples, strict=True)
             for j, s in enumerate(outs)]  # fmt: skip
    items += [reward_item(reward, ex, f"{ex.id}#greedy", g) for ex, g in zip(picked, greedy, strict=True)]
    results = score_results(reward_url, reward, items)
    outcomes = outcomes_from_results(picked, n, results)
    return build_report(reward, outcomes, temperature, min_informative=min_informative, min_improvable=min_improvable)


def outcomes_from_results(
    picked: Sequence[GoldenExample], n: int, results: Sequence[Mapping[str, Any]]
) -> list[PromptOutcome]:
    """reward_api results laid out as ``n`` samples per prompt, then one greedy answer per prompt."""
    if len(results) != len(picked) * (n + 1):
        raise ValueError(f"expected {len(picked) * (n + 1)} results ({len(picked)} prompts x (n={n} + greedy)), "
                         f"got {len(results)}")  # fmt: skip
    k = len(picked) * n
    out = []
    for i, ex in enumerate(picked):
        group = results[i * n : (i + 1) * n]
        g = results[k + i]
        out.append(
            PromptOutcome(
                id=ex.id,
                greedy=float(g["reward"]),
                samples=tuple(float(r["reward"]) for r in group),
                samples_valid=tuple(bool(r.get("valid_json", True)) for r in group),
                greedy_valid=bool(g.get("valid_json", True)),
            )
        )
    return out


def improvable_prompt_set(train_parquet: Path, ids: Iterable[str], out: Path) -> tuple[int, list[str]]:
    """Rows of the phase's RLHFDataset ``train_parquet`` whose ``extra_info.id`` is in ``ids``, written to
    ``out`` with the same Arrow schema (so ``data.train_files`` can point at it). Returns (rows kept,
    ids not found in the file). Raises when nothing is kept."""
    wanted = set(ids)
    table = pq.read_table(train_parquet)
    row_ids = rl_row_ids(table, train_parquet)
    keep = [i for i, rid in enumerate(row_ids) if rid in wanted]
    if not keep:
        raise ValueError(f"{train_parquet}: none of the {len(wanted)} improvable ids is in this file")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(keep), out)
    return len(keep), sorted(wanted - set(row_ids))


def sources_with_headroom(report: Mapping[str, Any], min_share: float) -> tuple[list[str], list[str]]:
    """(kept, dropped): the report's sources whose improvable share is at least ``min_share``, and the rest.

    Why: on E2E and RotoWire most "improvable" prompts are ones where the gold omits a column the text
    states, so a sample that drops a stated column beats the greedy answer there. Trained on
    them, B1 learned to drop columns: on a 4-GPU node, RotoWire validation schema F1 fell
    0.979 -> 0.965 (recall 0.991 -> 0.964) while WikiTableText rose 0.593 -> 0.603."""
    per = report.get("per_source") or {}
    if not per:
        raise ValueError("the report has no per_source statistics (a report written by an older version: rerun it)")
    kept = sorted(src for src, st in per.items() if st["improvable_share"] >= min_share)
    return kept, sorted(set(per) - set(kept))


@dataclass(frozen=True)
class FilteredPrompts:
    """What ``trainer preflight-filter`` wrote: rows kept, improvable ids not in the train file, and the
    sources dropped by ``min_source_share`` (None: no source filter)."""

    kept: int
    missing: list[str]
    dropped_sources: list[str] | None = None


class FilterError(ValueError):
    """The filter's input at fault (``report``, ``train`` or ``min_source_share``) and why."""

    def __init__(self, input_name: str, message: str) -> None:
        super().__init__(message)
        self.input_name = input_name


def filter_improvable(
    report: Mapping[str, Any], train: Path, out: Path, min_source_share: float = 0.0
) -> FilteredPrompts:
    """The offline difficulty filter (``trainer preflight-filter``): the training prompts of ``train`` whose
    best sample beat the greedy answer in ``report`` (a preflight report's dict), optionally only of the
    sources whose improvable share reaches ``min_source_share`` (:func:`sources_with_headroom`), written
    to ``out``. Raises :class:`FilterError` naming the input at fault."""
    if "improvable_ids" not in report:
        raise FilterError("report", "no improvable_ids (a report written by an older version: rerun it)")
    ids = list(report["improvable_ids"])
    dropped = None
    if min_source_share > 0:
        try:
            sources, dropped = sources_with_headroom(report, min_source_share)
        except ValueError as exc:
            raise FilterError("report", str(exc)) from None
        if not sources:
            raise FilterError("min_source_share", f"no source reaches {min_source_share} improvable prompts")
        ids = [i for i in ids if source_of(i) in sources]
    try:
        kept, missing = improvable_prompt_set(train, ids, out)
    except ValueError as exc:
        raise FilterError("train", str(exc)) from None
    return FilteredPrompts(kept, missing, dropped)


def write_report(report: PreflightReport | TemperatureChoice, path: Path) -> None:
    """A preflight report, or the temperature chosen from a sweep of them, as JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")


class SweepPoint(NamedTuple):
    """One phase at one temperature, as read from its report (``None``: a report written by an older version)."""

    informative_share: float
    mean_reward: float
    improvable_share: float | None = None
    best_minus_greedy: float | None = None
    invalid_share: float | None = None

    def share(self, criterion: Criterion) -> float:
        value = self.improvable_share if criterion == "improvable" else self.informative_share
        if value is None:
            raise ValueError(f"criterion {criterion!r}: a report has no {criterion}_share (rerun the preflight)")
        return value


Sweep = dict[float, dict[str, SweepPoint]]


@dataclass(frozen=True)
class TemperatureChoice:
    """The rollout temperature chosen from a preflight sweep, and why."""

    temperature: float
    reached: bool  # every phase has at least ``min_share`` (of ``criterion``) at ``temperature``
    min_share: float
    reason: str
    sweep: Sweep  # temperature -> phase -> its point
    criterion: Criterion = "improvable"
    # phases below ``min_share`` at the chosen temperature: report them as "no headroom", do not run them blind
    no_headroom: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "reached": self.reached,
            "criterion": self.criterion,
            "min_share": self.min_share,
            "no_headroom": list(self.no_headroom),
            "reason": self.reason,
            "sweep": {str(t): {ph: pt._asdict() for ph, pt in row.items()} for t, row in self.sweep.items()},
        }


def read_sweep(folder: Path, phases: Sequence[str]) -> Sweep:
    """``<phase>_t<temperature>.json`` reports (``write_report``'s format) of ``phases`` in ``folder``:
    temperature -> phase -> :class:`SweepPoint`. Only temperatures that every phase was checked at are kept."""
    by_t: Sweep = {}
    for phase in phases:
        for path in sorted(folder.glob(f"{phase}_t*.json")):
            try:
                rep = json.loads(path.read_text())
                t = float(rep["temperature"])

                def opt(key: str, rep: dict[str, Any] = rep) -> float | None:
                    return None if rep.get(key) is None else float(rep[key])

                by_t.setdefault(t, {})[phase] = SweepPoint(
                    float(rep["informative_share"]), float(rep["mean_reward"]),
                    opt("improvable_share"), opt("best_minus_greedy"), opt("invalid_share"),
                )  # fmt: skip
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: not a preflight report ({exc})") from None
    complete = {t: row for t, row in by_t.items() if set(row) == set(phases)}
    if not complete:
        found = sorted(p.name for p in folder.glob("*_t*.json"))
        raise ValueError(f"{folder}: no temperature with a report for every phase of {list(phases)} (found {found})")
    return dict(sorted(complete.items()))


def choose_temperature(sweep: Sweep, min_share: float, criterion: Criterion = "improvable") -> TemperatureChoice:
    """The lowest temperature at which every phase has at least ``min_share`` of ``criterion``: the
    samples closest to the policy's own (fewest invalid outputs) that still give GRPO something to use.
    If none reaches it, the temperature with the highest worst-phase share (ties: the lower
    temperature), marked not reached. Training prompts only: nothing here looks at validation or test.

    ``improvable`` (default) reads each phase's **macro** improvable share over sources, not its
    worst source: on this data E2E and RotoWire have none at any temperature, so a
    worst-source rule would never choose; the macro still rises with the headroom of the source that
    has it, and the prompt filter then keeps only prompts that are improvable. ``informative`` is the
    older rule (rewards not all equal), which overstates the signal."""
    if not sweep:
        raise ValueError("choose_temperature: empty sweep")
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share: must be in [0, 1], got {min_share}")
    what = "improvable prompts" if criterion == "improvable" else "informative groups"
    worst = {t: min(pt.share(criterion) for pt in row.values()) for t, row in sweep.items()}

    def below(t: float) -> tuple[str, ...]:
        return tuple(ph for ph, pt in sweep[t].items() if pt.share(criterion) < min_share)

    for t in sorted(sweep):
        if worst[t] >= min_share:
            return TemperatureChoice(
                t, True, min_share, f"lowest temperature with every phase >= {min_share:.0%} {what} "
                f"(worst phase {worst[t]:.0%})", sweep, criterion,
            )  # fmt: skip
    best = max(sorted(sweep), key=lambda t: worst[t])
    return TemperatureChoice(
        best, False, min_share, f"no temperature reaches {min_share:.0%} {what} in every phase; "
        f"the best worst-phase share is {worst[best]:.0%}", sweep, criterion, below(best),
    )  # fmt: skip

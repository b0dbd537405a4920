"""Positive control before any long GRPO run: can the wiring move the greedy answer at all?

A few GRPO steps on a small set of *improvable* prompts (``trainer preflight-filter``: the best of
``n`` samples beat the greedy answer), trained **and validated on the same prompts**, must raise
their greedy reward (VERL's validation: ``val_kwargs.do_sample=false``, ``val-core/<data_source>/
reward/mean@1``) by ``margin``. These prompts have a better answer the policy already samples, and the
run is graded on exactly them, so data cannot be the excuse: if the greedy reward does not rise, the
fault is in the wiring (reward path, advantages, optimiser, weight sync into the rollout), and a long
run would only burn GPU hours.

The run is the phase's own recipe (same profile, same GRPO settings, dynamic sampling included) with
only the data, the batch, the step count and the validation schedule changed: validation before
training and along the way, early stopping off (no step may end it early), ``size`` prompts a
step in mini batches of ``size / 4`` (4 updates a step), validation every ``steps / 4`` steps (the verdict
reads the last one). If dynamic sampling finds no informative group left (every prompt's samples score
the same, e.g. all solved), the run stops early and is judged on its last validation.

    python -m trainer positive-control b2 --prompts runs/preflight/b2_improvable.parquet --model M \\
        --reward-url URL [--size 16] [--steps 8] [--margin 0.05] [--profile gpu] [overrides...]

``margin`` is in reward units (rewards lie in [-1, 1]; schema reward = F1 for valid JSON, table reward
= 2·score − 1). 0.05 is about a third of the best-of-16 − greedy gap that the preflight measured
on WikiTableText (+0.15 π1, +0.12 π2) over *all* prompts; on prompts chosen because they have that gap,
training on them must recover at least that much.
"""

from __future__ import annotations

import json
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from trainer.phases.launch import PhaseResult, PhaseRun, Profile, read_metrics, run_phase
from trainer.registry.phases import Phase

RESULT_FILE = "positive_control.json"
_GREEDY = re.compile(r"^val-core/(?P<ds>[^/]+)/reward/mean@1$")


@dataclass(frozen=True)
class ControlConfig:
    size: int = 16  # prompts trained and validated on
    steps: int = 8  # GRPO steps
    margin: float = 0.05  # required rise of the greedy reward (macro over data sources), reward units
    seed: int = 0

    @property
    def val_every(self) -> int:
        return max(1, self.steps // 4)

    def __post_init__(self) -> None:
        if self.size < 4 or self.size % 4:
            raise ValueError(f"size must be a multiple of 4 (4 mini batches a step), got {self.size}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0.0 < self.margin <= 2.0:
            raise ValueError(f"margin must be in (0, 2] (reward units), got {self.margin}")


def control_overrides(prompts: Path, cfg: ControlConfig) -> tuple[str, ...]:
    """Hydra overrides that turn a GRPO phase into its positive control (everything else: the recipe)."""
    path = str(prompts.resolve())
    return (
        f"data.train_files={path}",
        f"data.val_files={path}",
        "data.train_max_samples=-1",
        "data.val_max_samples=-1",
        f"data.train_batch_size={cfg.size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.size // 4}",
        f"trainer.total_training_steps={cfg.steps}",
        # one epoch is one step here (the set is one batch): enough epochs for every step
        f"trainer.total_epochs={cfg.steps}",
        # validations along the way too: if dynamic sampling runs out of informative groups (every prompt
        # solved) before the last step, the last validation still shows what was learnt
        f"trainer.test_freq={cfg.val_every}",
        f"trainer.save_freq={cfg.val_every}",
        "trainer.val_before_train=true",
        "early_stopping.enabled=false",
        f"trainer.experiment_name=positive_control_{cfg.steps}x{cfg.size}",
    )


def pick_prompts(source: Path, out: Path, cfg: ControlConfig) -> int:
    """A seeded ``cfg.size`` rows of the improvable set ``source`` (file order kept), written to ``out``."""
    table = pq.read_table(source)
    if table.num_rows < cfg.size:
        raise ValueError(f"{source}: {table.num_rows} prompts, the control needs {cfg.size} (lower --size)")
    keep = sorted(random.Random(cfg.seed).sample(range(table.num_rows), cfg.size))
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(keep), out)
    return cfg.size


def greedy_rewards(rows: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> data source -> greedy validation reward (``val-core/<ds>/reward/mean@1``; ``<ds>`` may be
    ``table`` or ``table:wikitabletext``)."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        found = {m["ds"]: float(v) for k, v in (row.get("data") or {}).items() if (m := _GREEDY.match(k))}
        if found:
            out.setdefault(int(row["step"]), {}).update(found)
    return out


@dataclass(frozen=True)
class ControlVerdict:
    passed: bool
    margin: float
    reason: str
    step_before: int | None = None
    step_after: int | None = None
    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    gain: dict[str, float] | None = None
    macro_gain: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(rows: Sequence[Mapping[str, Any]], margin: float) -> ControlVerdict:
    """Passed when the greedy reward after the last validated step beats step 0's by ``margin``, as the
    macro mean over the data sources both validations scored."""
    by_step = greedy_rewards(rows)
    if 0 not in by_step:
        return ControlVerdict(False, margin, "no validation before training (step 0): the control cannot compare")
    last = max(by_step)
    if last == 0:
        return ControlVerdict(False, margin, "no validation after training: the run ended before its last step")
    before, after = by_step[0], by_step[last]
    common = sorted(set(before) & set(after))
    if not common:
        return ControlVerdict(False, margin, f"steps 0 and {last} scored no data source in common")
    gain = {ds: after[ds] - before[ds] for ds in common}
    macro = statistics.fmean(gain.values())
    passed = macro >= margin
    what = "passed" if passed else "FAILED"
    reason = (
        f"positive control {what}: greedy reward {statistics.fmean(before[d] for d in common):.4f} -> "
        f"{statistics.fmean(after[d] for d in common):.4f} after {last} steps (gain {macro:+.4f}, margin {margin})"
        + ("" if passed else ": the fault is in the wiring (reward, advantages, optimiser, weight sync), not the data")
    )  # fmt: skip
    return ControlVerdict(passed, margin, reason, 0, last, before, after, gain, round(macro, 6))


def control_run(
    phase: Phase,
    profile: Profile,
    prompts: Path,
    out: Path,
    model: str,
    reward_url: str | None,
    cfg: ControlConfig,
    overrides: Sequence[str] = (),
) -> PhaseRun:
    """The phase run of the control: its prompts are ``out/control_prompts.parquet`` (see :func:`pick_prompts`);
    the user's overrides come last and win."""
    chosen = out / "control_prompts.parquet"
    return PhaseRun(
        phase=phase,
        profile=profile,
        data_dir=prompts.parent,
        out_dir=out,
        model_path=model,
        reward_url=reward_url,
        overrides=(*control_overrides(chosen, cfg), *overrides),
    )


def run_control(run: PhaseRun, prompts: Path, cfg: ControlConfig) -> tuple[PhaseResult, ControlVerdict]:
    """Pick the prompts, train, judge; ``out/positive_control.json`` holds the verdict beside the phase result."""
    if run.phase.kind != "grpo":
        raise ValueError(f"the positive control runs a GRPO phase, not {run.phase.name}")
    pick_prompts(prompts, run.out_dir / "control_prompts.parquet", cfg)
    res = run_phase(run, export=False)
    verdict = judge(read_metrics(run.out_dir / "metrics.jsonl"), cfg.margin)
    exhausted = (res.failure or {}).get("cause") == "dynamic_sampling_exhausted"
    if res.status != "ok" and not exhausted:
        verdict = ControlVerdict(False, cfg.margin, f"positive control FAILED: the run failed ({res.error})")
    elif exhausted:
        # every group of the control's prompts scored the same: judged on the last validation before that
        verdict = ControlVerdict(**{**verdict.as_dict(), "reason": verdict.reason + " (dynamic sampling ran out of "
                                    "informative groups before the last step)"})  # fmt: skip
    record = {"verdict": verdict.as_dict(), "config": asdict(cfg), "prompts": str(prompts), "monitors": res.monitors}
    (run.out_dir / RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return res, verdict

"""The experiment's plan: its stages in order, what each needs served, and whether its result already
exists (then a rerun skips it). Pure over the config, the placement and the folder, so ``--dry-run``
prints it and the tests check it without starting anything.

- ``sft``: data build, then A1 ‖ A2 (or ``--sft-from``'s). Done: both phase results ok.
- ``preflight``: each swept phase's temperature sweep, the phases concurrently; serves the start policy,
  and for C1 the partner π2ˢ behind the pipeline reward API. Done: every ``<phase>_t<T>.json``.
- ``c2data`` (pi2-ab, beside the preflight): π1ˢ, served, writes C2's schemas. Done: ``data/c2/``'s files.
- ``choose``: the temperature (min share), the no-headroom stop, the improvable sets. Always (pure, cheap).
- ``control``: arm A's positive control, before RL (serial) or beside it (parallel). Done: its verdict file.
- ``rl``: both arms (side by side on GPUs, arm B staggered on a shared card; in turn on CPU) against their
  reward APIs. Done: both phase results ok.
- ``eval``: the Phase-D settings concurrently (settings that share a π1 share its Stage 1), then scored
  together (pi2-ab: π2 on gold schemas too; pi1-ab: the π1s' schemas alone, as soon as Stage 1 ends), on
  executors of every evaluated model. Done: ``phase_d/metrics.json`` (and ``gold_schema_eval/``'s or
  ``stage1_eval/``'s).

Executors are kept from the stage that starts them to the end (the preflight's policy, c2data's π1ˢ and
the pipeline reward's π2ˢ are those eval needs); on CPU a stage that trains first stops the ones it does
not need (memory: a CPU GRPO run takes ~19 GiB).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainer.experiment.config import ExperimentConfig
from trainer.experiment.design import Design
from trainer.experiment.placement import ArmPlacement
from trainer.experiment.workdir import Workdir
from trainer.phases.launch import PhaseRun
from trainer.phases.registry import get_phase
from trainer.runs import reuse

LOCAL, PIPE = "local", "pipe"  # the reward APIs: without executor, and with the frozen π2ˢ behind it


@dataclass(frozen=True)
class Stage:
    name: str
    done: bool  # its result exists: a rerun skips it
    executors: tuple[str, ...] = ()  # phases whose outputs it needs served (the SFT phases, or an arm)
    reward_apis: tuple[str, ...] = ()
    beside: str | None = None  # runs at the same time as this stage
    trains: bool = False  # it runs VERL phases (on CPU: the memory other servers must give up)
    lines: tuple[str, ...] = field(default=(), compare=False)  # what it runs, for --dry-run


def phase_ok(out: Path) -> bool:
    """The phase finished and its model is there (whether it may be reused: trainer.runs.reuse, at the stage)."""
    return reuse.finished(out) is not None


def reward_api_of(phase: str) -> str:
    return PIPE if get_phase(phase).reward == "pipeline" else LOCAL


def preflight_phases(cfg: ExperimentConfig, design: Design) -> tuple[str, ...]:
    return cfg.preflight_phases or design.preflight


def stages(cfg: ExperimentConfig, design: Design, wd: Workdir) -> list[Stage]:
    swept = preflight_phases(cfg, design)
    out = [
        Stage("sft", all(phase_ok(wd.phase(p)) for p in ("a1", "a2")), trains=True),
        Stage(
            "preflight",
            all(wd.report(p, t).is_file() for p in swept for t in cfg.temps),
            executors=(design.start, *((design.partner,) if PIPE in map(reward_api_of, swept) else ())),
            reward_apis=tuple(dict.fromkeys(map(reward_api_of, swept))),
        ),
    ]
    if design.c2_data:
        c2 = wd.data / "c2"
        done = all((c2 / f"{s}.parquet").is_file() for s in ("train", "validation"))
        out.append(Stage("c2data", done, executors=(design.partner,), beside="preflight"))
    out.append(Stage("choose", False))
    if cfg.control != "off":
        out.append(
            Stage(
                "control",
                (wd.control(design.arms[0]) / "positive_control.json").is_file(),
                reward_apis=(LOCAL,),
                beside="rl" if cfg.control == "parallel" else None,
                trains=True,
            )
        )
    apis = tuple(dict.fromkeys(map(reward_api_of, design.arms)))
    out.append(
        Stage(
            "rl",
            all(phase_ok(wd.phase(a)) for a in design.arms),
            executors=(design.partner,) if PIPE in apis else (),
            reward_apis=apis,
            trains=True,
        )
    )
    done = (
        (wd.phase_d / "metrics.json").is_file()
        and (not design.gold_schema_eval or (wd.gold_schema_eval / "metrics.json").is_file())
        and (not design.stage1_eval or (wd.stage1_eval / "metrics.json").is_file())
    )
    evaluated = tuple(dict.fromkeys(p for pair in design.settings().values() for p in pair))
    out.append(Stage("eval", done, executors=evaluated))
    return out


@dataclass(frozen=True)
class ExecutorStep:
    """What happens to the executors as a stage starts: started, reused (up since an earlier stage), stopped."""

    stage: str
    start: tuple[str, ...]
    reuse: tuple[str, ...]
    stop: tuple[str, ...]


def executor_timeline(plan: Sequence[Stage], on_cpu: bool) -> list[ExecutorStep]:
    """Executors by the phase whose output they serve, over the stages that run (done ones are skipped).
    A stage beside another one starts with it; on GPUs nothing stops before the end, on CPU a stage that
    trains first stops what it (and the stage beside it) does not need: GRPO needs the memory. (Two phases
    with the same output, e.g. an arm whose best step was step 0, share one executor at run time.)"""
    up: list[str] = []
    steps = []
    todo = [s for s in plan if not s.done]
    for stage in todo:
        together = [s for s in todo if s.beside == stage.name or stage.beside == s.name]
        need = list(dict.fromkeys([*stage.executors, *(p for s in together for p in s.executors)]))
        trains = stage.trains or any(s.trains for s in together)
        stop = tuple(p for p in up if p not in need) if on_cpu and trains else ()
        up = [p for p in up if p not in stop]
        start = tuple(p for p in stage.executors if p not in up)
        reuse = tuple(p for p in stage.executors if p in up)
        up += list(start)
        steps.append(ExecutorStep(stage.name, start, reuse, stop))
    return steps


def command_line(run: PhaseRun) -> str:
    where = f"CUDA_VISIBLE_DEVICES={','.join(run.gpus)} " if run.gpus else ""
    reward = f" [reward API {run.reward_url}]" if run.reward_url else ""
    return f"{where}{shlex.join(run.command())}  # {run.phase.name}: model {run.model_path} -> {run.out_dir}{reward}"


def describe(
    cfg: ExperimentConfig, design: Design, placement: ArmPlacement, plan: Sequence[Stage], details: dict[str, list[str]]
) -> str:
    """The ``--dry-run`` text: placement, then each stage with what it serves and runs."""
    timeline = {s.stage: s for s in executor_timeline(plan, placement.on_cpu)}
    lines = [f"experiment {design.name} in {cfg.workdir} (profile {cfg.profile}): {placement.describe()}"]
    for stage in plan:
        beside = f" (beside {stage.beside})" if stage.beside else ""
        lines.append(f"\n[{stage.name}]{beside}" + (" done: skipped (its result exists)" if stage.done else ""))
        if stage.done:
            continue
        step = timeline[stage.name]
        for verb, phases in (("stop", step.stop), ("start", step.start), ("reuse", step.reuse)):
            if phases:
                lines.append(f"  executors {verb}: " + ", ".join(design.served_name(p) for p in phases))
        if stage.reward_apis:
            lines.append(f"  reward APIs: {', '.join(stage.reward_apis)}")
        lines += [f"  {line}" for line in details.get(stage.name, [])]
    return "\n".join(lines)

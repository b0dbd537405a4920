"""An A/B experiment as a recipe over the trainer's shared parts (the plan's stages, in order; ``plan.py``
says what each runs and when it counts as done)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainer.experiment.config import ExperimentConfig
from trainer.experiment.context import Context, ControlRunner, ExperimentStopped
from trainer.experiment.design import Design
from trainer.experiment.plan import (
    Stage,
    command_line,
    describe,
    executor_timeline,
    phase_ok,
    preflight_phases,
    reward_api_of,
)
from trainer.experiment.plan import stages as plan_stages
from trainer.experiment.services import Services
from trainer.experiment.stages import WORKS, refuse_stale
from trainer.phases.launch import PhaseRunner, run_phase
from trainer.phases.positive_control import run_control
from trainer.phases.registry import get_phase
from trainer.runs.parallel import first_error

__all__ = ["Experiment", "ExperimentStopped"]


class Experiment:
    """The recipe: the plan's stages in order, each group's servers brought up first (in this thread, which
    owns them), stages beside each other in threads, every stage timed and recorded."""

    def __init__(
        self,
        design: Design,
        cfg: ExperimentConfig,
        runner: PhaseRunner = run_phase,
        control_runner: ControlRunner = run_control,
        say: Callable[[str], None] = print,
    ) -> None:
        self.ctx = Context(design, cfg, runner, control_runner, say)
        self.design, self.cfg, self.wd, self.placement, self.say = design, cfg, self.ctx.wd, self.ctx.placement, say
        self.servers_s = 0.0  # the last bring-up's seconds (servers started for the stages about to run)

    # -- the plan
    def plan(self) -> list[Stage]:
        return plan_stages(self.cfg, self.design, self.wd)

    def describe(self) -> str:
        """What ``--dry-run`` prints: the placement, each stage, its servers and its phase commands."""
        return describe(self.cfg, self.design, self.placement, self.plan(), self.details())

    def details(self) -> dict[str, list[str]]:
        cfg, d, wd = self.cfg, self.design, self.wd
        t = self.ctx.chosen_temperature() or "<chosen T>"
        sft = [f"data build --phases {','.join(self.ctx.data_phases())} -> {wd.data}"]
        if cfg.sft_from:
            sft = [f"reuse {cfg.sft_from}/{{data,a1,a2}}"]
        for i, p in enumerate(("a1", "a2") if d.start == "a1" else ("a2", "a1")):
            sft.append(command_line(self.ctx.sft_phase(p, self.placement.sft(i))))
        arms = [
            command_line(self.ctx.arm_phase(i, f"<{reward_api_of(a)} reward API>", t)) for i, a in enumerate(d.arms)
        ]
        if self.placement.shared_gpu:
            arms.insert(1, f"(arm B starts {cfg.rl_stagger_s:.0f} s after arm A: one GPU)")
        elif self.placement.on_cpu:
            arms.insert(1, "(then arm B: in turn on CPU)")
        if cfg.rl_mix_share:
            mixed = [a for a in d.arms if get_phase(a).built_from_golden]
            arms.insert(
                0,
                f"train mixes of {','.join(mixed) or 'no arm'} (C2: its split has no other source): "
                f"{cfg.rl_mix_share:g} of the prompts from the sources the chosen set lacks, evenly, seeded -> "
                f"{wd.train_sets}/<chosen set>+mix.parquet",
            )
        if cfg.rl_sources:
            arms.insert(0, f"train sets: each arm's train split of {','.join(cfg.rl_sources)} -> {wd.root}/train_sets/")
        evaluated = ", ".join(f"{n}=({d.served_name(p1)}, {d.served_name(p2)})" for n, (p1, p2) in d.settings().items())
        return {
            "sft": sft,
            "preflight": [
                f"{p}: {cfg.preflight_prompts} prompts/source x n {cfg.preflight_n} at T {list(cfg.temps)}"
                + (f", sources {','.join(cfg.preflight_sources)}" if cfg.preflight_sources else "")
                for p in preflight_phases(cfg, d)
            ]
            + ["(the phases' sweeps at once)"],
            "c2data": [
                f"π1ˢ schemas of {cfg.c2_train_sample} train documents"
                + (f" of {','.join(cfg.rl_sources)}" if cfg.rl_sources else "")
                + f" and every validation one -> {wd.data}/c2"
            ],
            "choose": [
                f"lowest T with macro improvable share >= {cfg.min_share} in every swept phase -> {wd.choice}",
                "no headroom: " + ("go on (--force-rl)" if cfg.force_rl else "stop"),
                f"improvable sets (min source share {cfg.min_source_share}) -> {wd.improvable('<phase>')}",
            ],
            "control": [command_line(self.ctx.control_phase("<local reward API>", t)[0])],
            "rl": arms,
            "eval": [f"Phase D on the test split, settings at once: {evaluated} -> {wd.phase_d}"]
            + ([f"π2 on gold schemas (sft, local, pipe) -> {wd.gold_schema_eval}"] if d.gold_schema_eval else []),
        }

    # -- the recipe
    def run(self) -> dict[str, Any]:
        cfg, manifest = self.cfg, self.ctx.manifest
        manifest.set("experiment", self.design.name)
        manifest.set("config", json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
        manifest.set("placement", self.placement.describe())
        if cfg.sft_from:
            self.link_sft_from()
        plan = self.plan()
        steps = {s.stage: s for s in executor_timeline(plan, self.placement.on_cpu)}
        with Services(self.design, self.placement, self.wd, cfg.reward_max_tokens) as services:
            self.ctx.services = services
            started: set[str] = set()
            for stage in plan:
                if stage.name in started:
                    continue
                group = [stage, *(s for s in plan if s.beside == stage.name and s.name not in started)]
                if stage.beside and stage.beside not in started:
                    group.append(next(s for s in plan if s.name == stage.beside))
                started |= {s.name for s in group}
                todo = [s for s in group if not s.done]
                for s in group:
                    if s.done:
                        refuse_stale(self.ctx, s.name)
                        self.record(s.name, {"status": "skipped: its result exists"})
                if not todo:
                    self.check_done(group)
                    continue
                t0 = time.monotonic()
                self.bring_up(todo, steps)
                self.servers_s = round(time.monotonic() - t0, 1)  # part of each stage's wall time
                self.run_together([(s.name, functools.partial(WORKS[s.name], self.ctx)) for s in todo])
                self.check_done(group)
        return manifest.data

    def bring_up(self, todo: Sequence[Stage], steps: dict[str, Any]) -> None:
        """In this (the main) thread: the servers these stages need; on CPU, before training, first stop what
        they do not need."""
        sv = self.ctx.sv
        phases = [p for s in todo for p in s.executors]
        apis = [a for s in todo for a in s.reward_apis]
        for p in {*phases, self.design.partner}:
            if phase_ok(self.wd.phase(p)):
                sv.models[p] = self.ctx.output(p)
        trains = any(s.trains for s in todo)
        if self.placement.on_cpu and trains and (stopped := sv.keep_only(phases, apis)):
            self.say(f"stopped {len(stopped)} executors (CPU: memory for {', '.join(s.name for s in todo)})")
        kept = [p for s in todo for p in steps[s.name].reuse]
        if kept:
            self.say(f"{', '.join(s.name for s in todo)}: reusing the executors of {sorted(set(kept))}")
        sv.serve(phases)
        sv.reward_apis(apis)

    def run_together(self, works: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """One stage here; several in threads (the servers are up, so threads only run clients and phases)."""
        if len(works) == 1:
            self.timed(*works[0])
            return
        with ThreadPoolExecutor(max_workers=len(works)) as pool:
            futures = []
            for i, (name, work) in enumerate(works):
                if i and name == "rl" and self.cfg.control == "parallel":
                    time.sleep(self.cfg.control_stagger_s if not self.placement.on_cpu else 0)
                futures.append(pool.submit(self.timed, name, work))
            first_error(futures)

    def timed(self, name: str, work: Callable[[], None]) -> None:
        """Run a stage's work; record its wall time (``seconds``: starting its servers, ``servers_s``, and
        the work) and status."""
        started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        t0 = time.monotonic() - self.servers_s
        self.say(f"== {name}")
        status = "failed"
        try:
            work()
            status = "ok"
        finally:
            seconds = round(time.monotonic() - t0, 1)
            self.record(name, {"status": status, "started": started, "seconds": seconds, "servers_s": self.servers_s})
            self.say(f"== {name}: {status} in {seconds} s")

    def record(self, name: str, value: dict[str, Any]) -> None:
        self.ctx.manifest.set(f"stage:{name}", value)

    def check_done(self, group: Sequence[Stage]) -> None:
        """A finished serial control that failed stops the experiment, also on a rerun that skips it."""
        for s in group:
            path = self.wd.control(self.design.arms[0]) / "positive_control.json"
            if s.name == "control" and self.cfg.control == "serial" and path.is_file():
                verdict = json.loads(path.read_text())["verdict"]
                if not verdict["passed"]:
                    raise ExperimentStopped(f"{verdict['reason']} ({path}); not running RL")

    def link_sft_from(self) -> None:
        """``--sft-from``: its data build and SFT, linked here (it must have finished them and built our phases)."""
        src = self.cfg.sft_from
        assert src is not None
        missing = [p for p in ("a1", "a2") if not phase_ok(src / p)]
        missing += [f"data/{p}" for p in self.ctx.data_phases() if not (src / "data" / p / "train.parquet").is_file()]
        if missing:
            raise ExperimentStopped(f"--sft-from {src}: not finished or not built: {', '.join(missing)}")
        self.wd.root.mkdir(parents=True, exist_ok=True)
        for name in ("data", "a1", "a2"):
            link = self.wd.root / name
            if not link.exists():
                link.symlink_to((src / name).resolve(), target_is_directory=True)

"""What every stage of an experiment works in: its design and config, its folder and placement, its
manifest, the servers the stages share and the phase runner; and what stages ask of it (a phase's model,
the chosen temperature, the phase runs with this placement), the way the loop's steps share a workspace."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainer.experiment.config import ExperimentConfig
from trainer.experiment.design import Design
from trainer.experiment.placement import ArmPlacement
from trainer.experiment.plan import PIPE, phase_ok, reward_api_of
from trainer.experiment.runs import (
    arm_run,
    control_run,
    improvable_train_files,
    mixed_train_files,
    sft_run,
    source_train_files,
)
from trainer.experiment.services import Services
from trainer.experiment.workdir import Workdir
from trainer.phases.launch import PhaseResult, PhaseRun, PhaseRunner, read_result
from trainer.phases.positive_control import ControlConfig, ControlVerdict
from trainer.runs import reuse
from trainer.runs.manifest import Manifest

ControlRunner = Callable[[PhaseRun, Any, ControlConfig], tuple[PhaseResult, ControlVerdict]]


class ExperimentStopped(RuntimeError):
    """A check said not to go on (no headroom, a failed positive control); the message says which."""


@dataclass
class Context:
    design: Design
    cfg: ExperimentConfig
    runner: PhaseRunner
    control_runner: ControlRunner
    say: Callable[[str], None]
    wd: Workdir = field(init=False)
    placement: ArmPlacement = field(init=False)
    manifest: Manifest = field(init=False)
    services: Services | None = None  # while the experiment runs
    temperature: float | None = None  # chosen this run (else read from the choice file)

    def __post_init__(self) -> None:
        self.wd = Workdir(self.cfg.workdir)
        self.placement = ArmPlacement.of(self.cfg.gpus if self.cfg.profile == "gpu" else ())
        self.manifest = Manifest.open(self.wd.manifest)

    def sft_phase(self, phase: str, placement: Any) -> PhaseRun:
        return sft_run(self.cfg, phase, self.base_model(), self.wd.phase(phase), self.wd.data, placement)

    def chosen_set(self, arm: str) -> tuple[str | None, str]:
        """The arm's train files before any mix: its improvable set, else its ``--rl-sources`` set, else None
        (its train split); and why."""
        files, why = improvable_train_files(self.cfg, arm, self.wd.improvable(arm))
        if files is None and self.cfg.rl_sources:
            files, why_sources = source_train_files(self.cfg, arm, self.wd.source_set(arm, self.cfg.rl_sources))
            why = why or why_sources
        return files, why

    def arm_phase(self, index: int, reward_url: str, temperature: float | str, say: bool = False) -> PhaseRun:
        arm = self.design.arms[index]
        files, why = self.chosen_set(arm)
        files, why_mix = mixed_train_files(self.cfg, arm, files, self.wd.train_sets)
        why = "; ".join(w for w in (why, why_mix) if w)
        if say and why:
            self.say(why)
        start = (
            self.output(self.design.start)
            if phase_ok(self.wd.phase(self.design.start))
            else f"<{self.design.start} export>"
        )
        # the pipeline reward's frozen π2 (the partner's output) is an input of what the arm learns
        partner = self.wd.phase(self.design.partner)
        frozen = self.output(self.design.partner) if reward_api_of(arm) == PIPE and phase_ok(partner) else None
        return arm_run(
            self.cfg,
            arm,
            start,
            reward_url,
            self.wd.phase(arm),
            self.wd.data,
            self.placement.arm(index),
            temperature,
            files,
            reward_model=frozen,
        )

    def control_phase(self, reward_url: str, temperature: float | str) -> tuple[PhaseRun, ControlConfig]:
        phase, d = self.design.arms[0], self.design
        start = self.output(d.start) if phase_ok(self.wd.phase(d.start)) else f"<{d.start} export>"
        return control_run(
            self.cfg, phase, start, reward_url, self.wd.improvable(phase), self.wd.control(phase),
            self.placement.a, temperature,
        )  # fmt: skip

    def run_phases(self, jobs: Sequence[tuple[str, PhaseRun]], stagger_s: float) -> None:
        """Phases side by side on GPUs (each after ``stagger_s``), in turn on CPU; raises if one failed."""
        if self.placement.on_cpu or len(jobs) < 2:
            results = [self.runner(run) for _p, run in jobs]
        else:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                futures = []
                for i, (_p, run) in enumerate(jobs):
                    if i and stagger_s:
                        time.sleep(stagger_s)
                    futures.append(pool.submit(self.runner, run))
                results = [f.result() for f in futures]
        failed = [f"{p} (exit {r.exit_code}: {r.error}; log {run.out_dir / 'train.log'})"
                  for (p, run), r in zip(jobs, results, strict=True) if r.status != "ok" or not r.hf_dir]  # fmt: skip
        for (p, run), r in zip(jobs, results, strict=True):
            self.manifest.set(f"phase:{p}", dataclasses.asdict(r))
            if r.status == "ok" and r.hf_dir:
                reuse.record(run.out_dir, reuse.run_inputs(run))
        if failed:
            raise RuntimeError(f"phases failed: {'; '.join(failed)}")

    def reusable(self, run: PhaseRun) -> bool:
        """The phase finished from the inputs ``run`` would give it; StaleResultError (which names each
        difference) if it finished from others (trainer.runs.reuse)."""
        return reuse.reuse_or_refuse(run.out_dir, reuse.run_inputs(run), run.phase.name) is not None

    def output(self, phase: str) -> str:
        """The model a phase produced: its phase result's ``hf_dir`` (the input model when early stopping kept
        step 0, so nothing asks for an export that does not exist)."""
        res = read_result(self.wd.phase(phase))
        if res is None or res.status != "ok" or not res.hf_dir:
            raise RuntimeError(f"{self.wd.phase(phase)}: no finished phase result with a model (hf_dir)")
        return res.hf_dir

    def base_model(self) -> str:
        """``--base-model``, else the default model (converted once; a dry run does not convert it)."""
        if self.cfg.base_model:
            return self.cfg.base_model
        if self.cfg.dry_run:
            return "<SmolLM2-135M-Instruct, converted on the first run>"
        from services.executor_vllm.default_model import convert

        return str(convert())

    def data_phases(self) -> tuple[str, ...]:
        return self.cfg.data_phases or self.design.data_phases

    def chosen_temperature(self) -> float | None:
        if self.wd.choice.is_file():
            return float(json.loads(self.wd.choice.read_text())["temperature"])
        return None

    def need_temperature(self) -> float:
        t = self.temperature if self.temperature is not None else self.chosen_temperature()
        if t is None:
            raise RuntimeError(f"no rollout temperature chosen ({self.wd.choice} is missing)")
        return t

    @property
    def sv(self) -> Services:
        assert self.services is not None, "the servers exist only while the experiment runs"
        return self.services


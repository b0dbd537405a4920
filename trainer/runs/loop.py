"""``trainer loop``: (A1 ‖ A2 →) B1 ‖ B2 → C1 → C2's schemas → C2 → Phase D, and loop 2 when its rule says so; the
steps, placement and reuse are docs/training.md's. Resumable: each phase by :mod:`trainer.runs.reuse`, C2's data
and Phase D by their content keys; ``--until`` stops after a part and a rerun goes on from there."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from shared.golden import sha256_file
from shared.split_overlap import SplitOverlap, shown
from trainer.phase_rules.reward_ready import ABORT_FILE
from trainer.phases.launch import CONFIG_DIR, PhaseRun, PhaseRunner, run_phase
from trainer.registry.phases import BUILD_PHASES, SFT_PHASES, RewardKind, reward_of, sft_phase_for
from trainer.runs import c2_data, phase_d_part, reuse
from trainer.runs.config import LoopConfig
from trainer.runs.context import RunContext
from trainer.runs.record import read_json
from trainer.serving.executors import ModelSpec, serve_model
from trainer.serving.gpus import ExecutorSlot, Placement


class StopAfter(Exception):
    """The part named by ``--until`` finished; the record says where to go on."""


class Loop:
    def __init__(self, cfg: LoopConfig, runner: PhaseRunner = run_phase) -> None:
        self.cfg = cfg = dataclasses.replace(cfg, out=cfg.folder("loop"))
        self.ctx = RunContext("loop", cfg, runner)
        self.out, self.data, self.record, self.plan = self.ctx.root, self.ctx.data, self.ctx.record, self.ctx.plan
        self.runner = self.ctx.runner
        self.splits: SplitOverlap | None = None  # set by check_splits, before any phase

    def run(self) -> dict[str, Any]:
        """The whole loop, or up to ``--until``'s part; a rerun goes on from the last finished part."""
        try:
            with self.ctx.servers:
                return self._run()
        except StopAfter as stop:
            self.record.set("stopped_after", str(stop))
            return self.record.data

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        configs = {str(p.relative_to(CONFIG_DIR)): sha256_file(p) for p in sorted(CONFIG_DIR.rglob("*.yaml"))}
        golden = {str(p): sha256_file(p) for p in sorted(cfg.golden.glob("common_*_schemas.jsonl"))}
        self.record.set("inputs", {"golden": golden, "configs": configs})
        self.check_splits()
        with self.ctx.part("sft"):
            self.build_data()
            pi1_sft, pi2_sft = self.sft()
            rft = self.rft(pi1_sft, pi2_sft) if cfg.rft else None
        self.stop_if("sft")
        with self.ctx.part("local"), self.ctx.servers.scoped("local", external=cfg.reward_url) as url:
            (at1, at2), together = self.ctx.places(2)
            b1 = self.run_of("b1", pi1_sft, self.out / "b1", placement=at1, reward_url=url)
            b2 = self.run_of("b2", pi2_sft, self.out / "b2", placement=at2, reward_url=url)
            pi1_local, pi2_local = self.launch(b1, b2, together=together)
        self.stop_if("local")
        pi1_pipe, pi2_pipe = self.pipeline_round(pi1_local, pi2_local, "loop1")
        settings = {"sft": (pi1_sft, pi2_sft), "local": (pi1_local, pi2_local), "pipe": (pi1_pipe, pi2_pipe)}
        if cfg.eval_base and cfg.base_model:  # where SFT started from (π1 = π2 = the base model)
            settings = {"base": (cfg.base_model, cfg.base_model), **settings}
        if rft:
            settings["rft"] = rft
        with self.ctx.part("eval"):  # loop 1's gain: the pipeline round (pipe) over its start (local)
            decision = self.evaluate(settings, "loop1", ("local", "pipe"))
        self.stop_if("eval")
        if cfg.loops >= 2 and decision.get("decision") == "continue":
            p1, p2 = self.pipeline_round(pi1_pipe, pi2_pipe, "loop2")
            with self.ctx.part("loop2"):
                decision = self.evaluate({"pipe": (pi1_pipe, pi2_pipe), "pipe2": (p1, p2)}, "loop2", ("pipe", "pipe2"))
        self.record.set("final_decision", decision)
        self.record.write_report()
        return self.record.data

    def stop_if(self, part: str) -> None:
        if self.cfg.until == part:
            raise StopAfter(part)

    # -- its parts
    def check_splits(self) -> SplitOverlap:
        """The golden folder's preflight, before any phase: every split holds examples and, with
        ``--strict-splits``, no two splits share a document (:mod:`shared.split_overlap`); what it found is
        recorded (``split_overlap``: the overlaps and the train rows the data build drops)."""
        from shared.split_overlap import check_splits, read_overlaps

        cfg = self.cfg
        self.splits = found = check_splits(read_overlaps(cfg.golden, cfg.limit), cfg.strict_splits)
        rep = found.repeats.get("train")
        self.record.set("split_overlap", {
            "strict": cfg.strict_splits, "documents_shared": found.counts(),
            "dropped_train": {"count": len(found.train_drop), "ids": found.train_drop},
            "train_repeats": {"texts": rep.texts, "extra_rows": rep.extra_rows} if rep else None,
        })  # fmt: skip
        return found

    def build_data(self) -> None:
        from shared.split_overlap import SplitOverlapError
        from trainer.data.datasets import build_datasets
        from trainer.data.sft_mix import SourceMix, check_reuse

        phases = [*self.sft_phases(), *(p for p in BUILD_PHASES if p not in SFT_PHASES)]
        mix = SourceMix.parse(self.cfg.sft_mix) if self.cfg.sft_mix else None
        if all((self.data / p / "train.parquet").is_file() for p in phases):
            check_reuse(self.data, mix)
            drop = (self.splits or self.check_splits()).train_drop
            recorded = ((read_json(self.data / "manifest.json") or {}).get("split_overlap") or {}).get("dropped_train")
            if sorted((recorded or {}).get("ids", [])) != sorted(drop):
                raise SplitOverlapError(
                    f"{self.data} holds data built with train rows that repeat a validation or test document (or "
                    f"from other golden data): remove it to build again; the train rows to drop are {len(drop)}"
                    + (f" ({shown(drop)})" if drop else "")
                )
            return
        counts = build_datasets(self.cfg.golden, self.data, phases, limit=self.cfg.limit, sft_mix=mix,
                                strict_splits=self.cfg.strict_splits)  # fmt: skip
        self.record.set("data", {"dir": str(self.data), "counts": counts})

    def sft_phases(self) -> list[str]:
        """A1 and/or A2, for whichever SFT policy was not given."""
        return [p for p, given in (("a1", self.cfg.pi1_sft), ("a2", self.cfg.pi2_sft)) if not given]

    def sft(self) -> tuple[str, str]:
        """π1ˢ and π2ˢ: the given checkpoints, or A1/A2 from the base model (side by side on GPUs)."""
        models = {"a1": self.cfg.pi1_sft, "a2": self.cfg.pi2_sft}
        todo, base = self.sft_phases(), self.cfg.base_model
        if todo and not base:
            raise ValueError(f"{todo[0]}: no SFT checkpoint given and no base model to train it from")
        places, together = self.ctx.places(len(todo), sft=True)
        runs = [self.run_of(n, str(base), self.out / n, placement=p) for n, p in zip(todo, places, strict=True)]
        models.update(zip(todo, self.launch(*runs, together=together), strict=True))
        pi1, pi2 = models["a1"], models["a2"]
        assert pi1 and pi2
        return pi1, pi2

    def rft(self, pi1_sft: str, pi2_sft: str) -> tuple[str, str]:
        """The RFT baseline: π1ˢ (schema reward) and π2ˢ (table reward) sample k outputs per training prompt, the
        best ≥ threshold are kept and A1/A2 fine-tune them on those (:mod:`trainer.rft`)."""
        from trainer.rft import RftConfig, build_rft_data

        cfg = self.cfg
        gen = RftConfig(k=cfg.rft_k, threshold=cfg.rft_threshold, max_tokens=cfg.eval_max_tokens)
        models: dict[str, str] = {}
        starts: tuple[tuple[RewardKind, str], ...] = (("schema", pi1_sft), ("table", pi2_sft))
        for reward, start in starts:
            base, phase = self.out / "rft" / reward, sft_phase_for(reward)
            if reuse.finished(base / "sft") is None and not (base / "data" / phase / "train.parquet").is_file():
                with self.ctx.servers.scoped(f"rft_{reward}", external=cfg.reward_url) as url:
                    (ep,) = self.ctx.servers.serve([ModelSpec(start, log=self.ctx.logs / f"executor_rft_{reward}.log")])
                    rep = build_rft_data(cfg.golden, base, reward, ep.url, ep.served_name, url, gen, cfg.limit)
                    self.ctx.servers.pool.stop_except([])
                self.record.set(f"rft:{reward}", rep.as_dict() | {"policy": start})
            models[reward] = self.phase(phase, start, None, base / "sft", data_dir=base / "data")
        return models["schema"], models["table"]

    def pipeline_round(self, pi1_start: str, pi2_start: str, tag: str) -> tuple[str, str]:
        """C1 (π2 frozen in the reward API's executors) → C2's schemas from the new π1 → C2."""
        base = self.out if tag == "loop1" else self.out / tag
        data = self.data if tag == "loop1" else base / "data"
        if tag != "loop1":
            self.link_c1_data(data)
        trainer, slots = (self.plan.c1() if self.plan else (None, [None]))
        with self.ctx.part("c1" if tag == "loop1" else f"c1_{tag}"):
            run = self.run_of("c1", pi1_start, base / "c1", data, trainer, reward_model=pi2_start)
            pi1_pipe = self.ctx.reused(run) or self.c1(run, pi2_start, f"c1_{tag}", list(slots))
        self.stop_if("c1" if tag == "loop1" else "")
        with self.ctx.part("c2" if tag == "loop1" else f"c2_{tag}"):
            self.c2_schemas(pi1_pipe, data, tag)
            with self.ctx.servers.scoped(f"c2_{tag}", external=self.cfg.reward_url) as url:
                whole = self.plan.whole() if self.plan else None
                pi2_pipe = self.phase("c2", pi2_start, url, base / "c2", data, placement=whole)
        self.stop_if("c2" if tag == "loop1" else "")
        return pi1_pipe, pi2_pipe

    def link_c1_data(self, data: Path) -> None:
        """Loop 2 reuses loop 1's C1 data but gets a C2 of its own (new π1 schemas)."""
        if not (data / "c1").exists():
            data.mkdir(parents=True, exist_ok=True)
            (data / "c1").symlink_to((self.data / "c1").resolve(), target_is_directory=True)

    def c1(self, run: PhaseRun, pi2: str, tag: str, slots: list[ExecutorSlot | None]) -> str:
        """C1 against a reward API with π2 in its executors: the cluster's (checked), or local ones started beside
        the trainer, unless they share its one GPU (two vLLM start-ups on one card misjudge its free memory)."""
        servers = self.ctx.servers
        if self.cfg.c1_reward_url or (self.plan is not None and self.plan.shared):
            with servers.scoped(tag, executor_model=pi2, slots=slots, external=self.cfg.c1_reward_url) as url:
                return self.launch(dataclasses.replace(run, reward_url=url))[0]
        with servers.beside(tag, pi2, slots, run.out_dir / ABORT_FILE) as url:
            return self.launch(dataclasses.replace(run, reward_url=url))[0]

    def c2_schemas(self, pi1_pipe: str, data: Path, tag: str) -> None:
        """π1ʳ-pipe, served here (or checked at ``--pi1-pipe-url``), writes C2's schemas (gold where invalid)."""
        if c2_data.is_done(data, c2_data.precompute_key(self.cfg, pi1_pipe, "gold")):
            return
        slot = ExecutorSlot(self.plan.gpus[:1]) if self.plan else None
        log = self.ctx.logs / f"executor_precompute_{tag}.log"
        if self.cfg.pi1_pipe_url:
            what = f"precompute {tag} (π1ʳ-pipe)"
            with serve_model(pi1_pipe, log, slot, external=self.cfg.pi1_pipe_url, what=what) as ep:
                c2_data.write_c2_data(self.ctx, ep, pi1_pipe, data, tag, "gold")
            return
        (ep,) = self.ctx.servers.serve([ModelSpec(pi1_pipe, slot=slot, log=log)])
        c2_data.write_c2_data(self.ctx, ep, pi1_pipe, data, tag, "gold")
        self.ctx.servers.pool.stop_except([])

    # -- one phase
    def run_of(
        self, name: str, model: str, out_dir: Path, data_dir: Path | None = None, placement: Placement | None = None,
        reward_url: str | None = None, reward_model: str | None = None,
    ) -> PhaseRun:  # fmt: skip
        data_dir = data_dir or self.data
        files = None if name in SFT_PHASES else self.ctx.train_files(name, self.ctx.key(out_dir), data_dir)[0]
        return self.ctx.phase_run(name, model, out_dir, data_dir=data_dir, placement=placement,
                                  reward_url=reward_url, reward_model=reward_model, train_files=files)  # fmt: skip

    def phase(
        self, name: str, model: str, reward_url: str | None, out_dir: Path, data_dir: Path | None = None,
        placement: Placement | None = None, reward_model: str | None = None,
    ) -> str:  # fmt: skip
        """One phase, reused or launched; its exported model."""
        return self.launch(self.run_of(name, model, out_dir, data_dir, placement, reward_url, reward_model))[0]

    def launch(self, *runs: PhaseRun, together: bool = False) -> list[str]:
        """Phases reused or launched (after the optional advantage preflight); their exported models."""
        return self.ctx.run_phases(runs, together=together, before=self.preflight)

    def preflight(self, run: PhaseRun) -> None:
        """``--preflight-min``: the advantage check of a GRPO phase's start policy; stops the loop when its groups teach
        too little."""
        from trainer.checks.preflight import advantage_check, write_report

        cfg, key = self.cfg, self.ctx.key(run.out_dir)
        if cfg.preflight_min is None or run.phase.kind == "sft" or not run.reward_url:
            return
        slot = ExecutorSlot(run.gpus[:1], 0.3) if run.gpus else None
        log = self.ctx.logs / f"executor_preflight_{run.phase.name}.log"
        (ep,) = self.ctx.servers.serve([ModelSpec(run.model_path, slot=slot, log=log)])
        rep = advantage_check(
            cfg.golden, reward_of(run.phase.name), ep.url, ep.served_name, run.reward_url,
            n=cfg.preflight_n, prompts=cfg.preflight_prompts, min_informative=float(cfg.preflight_min or 0.0),
            max_tokens=cfg.eval_max_tokens, sources=cfg.rl_sources or None, limit=cfg.limit,
        )  # fmt: skip
        self.ctx.servers.pool.stop_except([])
        write_report(rep, run.out_dir / "preflight.json")
        self.record.set(f"preflight:{key}", rep.as_dict())
        if not rep.ok:
            raise RuntimeError(
                f"phase {key}: {rep.verdict()} Raise the rollout temperature or n, filter the prompts "
                f"(trainer preflight-filter), or start from another policy (report: {run.out_dir / 'preflight.json'})"
            )

    # -- Phase D
    def eval_key(self, settings: dict[str, tuple[str, str]]) -> dict[str, Any]:
        return phase_d_part.eval_key(self.cfg, settings)

    def evaluate(self, settings: dict[str, tuple[str, str]], tag: str, compare: tuple[str, str]) -> dict[str, Any]:
        """Phase D of ``settings`` on the test split and the loop-2 decision of ``compare`` = (previous, last);
        scores are reused for the same key, the decision taken again by the current rule."""
        cfg, out = self.cfg, self.out / f"eval_{tag}"
        decide: dict[str, Any] = {"decision_metric": cfg.decision_metric, "min_gain_points": cfg.min_gain,
                                  "compare": compare}  # fmt: skip
        key = self.eval_key(settings)
        recorded = read_json(out / "metrics.json")
        same = recorded and phase_d_part.eval_key_difference(out, key) is None
        if same and set(recorded["settings"]) == set(settings):
            decision = redecide(out, recorded, f"Phase D ({tag})", **decide)
            self.record.phase_d(f"eval_{tag}", out, settings, decision)
            return decision
        examples = phase_d_part.test_examples(cfg)
        spec, waves = phase_d_part.placed(self.ctx, settings, "eval")
        scored = phase_d_part.score(self.ctx, settings, examples, spec, waves=waves)
        self.ctx.servers.pool.stop_except([])
        preds = {name: scored.records[name] for name in settings}
        res = phase_d_part.write(self.ctx, f"eval_{tag}", out, settings, examples, preds, scored.modes,
                            f"Phase D ({tag})", **decide)  # fmt: skip
        phase_d_part.record_eval_key(out, key)
        return res.decision


def redecide(
    out: Path, recorded: dict[str, Any], title: str, decision_metric: str, min_gain_points: float,
    compare: tuple[str, str],
) -> dict[str, Any]:  # fmt: skip
    """The loop-2 decision over recorded Phase-D metrics; rewrites metrics.json and report.md if it changed."""
    from trainer.evaluation.phase_d import loop2_decision
    from trainer.evaluation.report import markdown_report

    decision = loop2_decision(recorded["settings"], decision_metric, min_gain_points, compare)
    if decision != recorded.get("loop2"):
        recorded["loop2"] = decision
        (out / "metrics.json").write_text(json.dumps(recorded, indent=2) + "\n")
        report = markdown_report(
            recorded["settings"], decision, title, recorded.get("paired_tests"), recorded.get("max_tokens"),
            recorded.get("serving"),
        )  # fmt: skip
        (out / "report.md").write_text(report)
    return decision


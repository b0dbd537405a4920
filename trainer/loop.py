"""The training loop (A1, A2 →) B1 → B2 → C1 → C2 → Phase-D evaluation (DESIGN §1), resumable, with a manifest.

``python -m trainer loop --golden G --out O [--profile cpu-smoke] [--pi1-sft M --pi2-sft M | --base-model M]``

- Without ``--pi1-sft``/``--pi2-sft`` the loop first runs A1 and A2 (SFT from ``--base-model``;
  the cpu-smoke default is SmolLM2-135M-Instruct) and uses their exports as π1ˢ and π2ˢ.
- B1 trains π1ˢ → π1ʳ-local and B2 trains π2ˢ → π2ʳ-local (reward_api without executor).
- C1 trains π1ʳ-local → π1ʳ-pipe; the reward_api's executor serves the frozen π2ʳ-local.
  Locally (no ``--c1-reward-url``) the loop starts a vLLM-CPU executor on π2ʳ-local and a reward_api
  pointed at it; on a cluster, pass the URL of a reward_api whose executor serves π2ʳ-local.
- Before C2, π1ʳ-pipe precomputes the C2 schemas (``trainer.data.precompute.precompute_c2``), served by
  a local vLLM-CPU executor or ``--pi1-pipe-url``.
- C2 trains π2ʳ-local → π2ʳ-pipe. Phase D scores sft / local / pipe end to end on the test split
  (each model served in turn, one vLLM server at a time) and applies the loop-2 rule.
- ``--rft``: the RFT baseline beside RL (``trainer.rft``): π1ˢ and π2ˢ, each served locally,
  sample k outputs per training prompt, reward_api scores them, the best ≥ threshold are kept and
  A1/A2 fine-tune π1ˢ/π2ˢ on them; Phase D adds the setting ``rft``.
- ``--loops 2``: if loop 1's end-to-end gain is ≥ ``--min-gain`` points, C1 → C2 run again from the
  pipe policies (π2ʳ-pipe as the frozen executor) and Phase D compares pipe2 with pipe.

GPU nodes (``--profile gpu``; ``--gpus`` or ``CUDA_VISIBLE_DEVICES``, else every GPU): phases are placed
by :mod:`trainer.serving.gpus`: A1 beside A2 and B1 beside B2 on disjoint halves, the C1 executors of
π2 on GPUs of their own beside the trainer (one GPU: a shared card, memory split), Phase-D settings
side by side. Executors and reward APIs start through :mod:`trainer.serving` only.
``--until sft|local|c1|c2|eval`` stops after that part of the loop, so each documented command fits a
time-limited job; the next command goes on from there.

Resumable: a phase whose ``phase_result.json`` says ok and whose exported model exists is skipped,
as are the built data files; a phase result recorded with other inputs (``phase_inputs.json``: start
model fingerprint, data files' sha256) stops the loop instead of being reused. The C2 precompute
and Phase D are reused only if their content key matches (``precompute_key.json``,
``eval_key.json``: the models' content fingerprints, the golden files' sha256 and the settings);
otherwise they are recomputed. ``loop_manifest.json`` records
every input (golden files with sha256, start models, reward URLs), config (phase YAML sha256,
command), checkpoint, exported model and metric, and is rewritten after every step.

External URLs are checked before use: ``--pi1-pipe-url`` must serve π1ʳ-pipe, and
``--c1-reward-url``'s executor must serve the π2 of this round (π2ʳ-local in loop 1, π2ʳ-pipe in
loop 2), by folder (``/v1/models`` ``root``) or by the content hash in the served name
(:mod:`trainer.serving.identity`). A mismatch stops the loop; the manifest's ``served:*``
entries record what was served.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.phases.launch import (
    CONFIG_DIR,
    PhaseResult,
    PhaseRun,
    Profile,
    read_result,
    run_phase,
)
from trainer.phases.registry import BUILD_PHASES, SFT_PHASES, get_phase, reward_of, sft_phase_for
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import replica_logs, serve_model
from trainer.serving.gpus import ExecutorSlot, GpuPlan, Placement, waves
from trainer.serving.identity import fingerprint
from trainer.serving.reward_api import serve_reward_api

MANIFEST = "loop_manifest.json"
# content keys of reused results: C2's precomputed data and Phase D's scores (see precompute_key, eval_key)
PRECOMPUTE_KEY = "precompute_key.json"
EVAL_KEY = "eval_key.json"
PHASE_INPUTS = "phase_inputs.json"
# The loop's parts, in order (``--until``): a run stops after the named part; a rerun goes on from there.
# (The manifest keeps its keys ``done:<part>`` / ``time:<part>``; bench/gpu/loop_node.sh reads them.)
PARTS = ("sft", "local", "c1", "c2", "eval")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class LoopConfig:
    golden: Path
    out: Path
    profile: Profile
    pi1_sft: str | None
    pi2_sft: str | None
    base_model: str | None = None
    sft_overrides: tuple[str, ...] = ()
    reward_url: str | None = None
    c1_reward_url: str | None = None
    pi1_pipe_url: str | None = None
    limit: int | None = None
    eval_limit: int | None = None
    loops: int = 1
    min_gain: float = 1.0
    decision_metric: str = "aligned_cell_f1"  # phase_d.DEFAULT_DECISION_METRIC (imported lazily there)
    overrides: tuple[str, ...] = ()
    executor_max_tokens: int = 256
    eval_max_tokens: int = 256
    rft: bool = False
    rft_k: int = 4
    rft_threshold: float = 0.5
    # GPU ids of this node (the gpu profile): phases are placed by trainer/serving/gpus.py. Empty: CPU.
    gpus: tuple[str, ...] = ()
    until: str | None = None
    reward_workers: int = 1
    # Before each GRPO phase: the share of groups whose rewards differ (trainer/phases/preflight.py);
    # below it, the phase is not started. None: no check.
    preflight_min: float | None = None
    # GPU executors (C1's frozen π2, the C2 precompute, Phase D) without CUDA graphs / torch.compile: each
    # starts in well under a minute, where compilation costs more than it saves for a 135M model.
    executor_eager: bool = True
    # C2's precompute: a seeded random sample of this many train documents (None: the whole split). VERL
    # draws data.train_max_samples prompts from the C2 train file; schemas for the rest are never used.
    c2_train_prompts: int | None = None

    def __post_init__(self) -> None:
        if self.until is not None and self.until not in PARTS:
            raise ValueError(f"until: must be one of {list(PARTS)}, got {self.until!r}")


class StaleResultError(RuntimeError):
    """A recorded phase result was trained from other inputs than this run would give it."""


class StopAfter(Exception):
    """The part named by ``--until`` finished; the manifest records where to go on."""


@dataclass
class Manifest:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    # Phases beside each other (A1 and A2, B1 and B2, Phase-D settings) record from their own threads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path) -> Manifest:
        return cls(path, json.loads(path.read_text()) if path.is_file() else {})

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.data["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
            tmp.replace(self.path)


# ---- the loop -------------------------------------------------------------------------------------


def phase_done(out_dir: Path) -> PhaseResult | None:
    """The recorded result if the phase finished and its exported model is present."""
    res = read_result(out_dir)
    if res is None or res.status != "ok" or not res.hf_dir or not Path(res.hf_dir).exists():
        return None
    return res


class Loop:
    def __init__(self, cfg: LoopConfig, runner: Callable[[PhaseRun], PhaseResult] = run_phase) -> None:
        self.cfg = cfg
        self.runner = runner
        self.out = cfg.out
        self.data = cfg.out / "data"
        self.manifest = Manifest.open(cfg.out / MANIFEST)
        self.plan = GpuPlan(cfg.gpus) if cfg.gpus else None
        self.mark = time.time()  # start of the part now running (see finished)

    # -- placement (GPU profile) and the loop's parts
    def whole(self) -> Placement | None:
        return self.plan.whole() if self.plan else None

    def side_by_side(self, jobs: Sequence[Callable[[Placement | None], str]]) -> list[str]:
        """Two independent jobs: on disjoint GPU halves at once when the node has them, else in turn."""
        pair = self.plan.pair() if self.plan else None
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

    # -- bookkeeping
    def record_inputs(self) -> None:
        golden = {str(p): sha256(p) for p in sorted(self.cfg.golden.glob("common_*_schemas.jsonl"))}
        configs = {str(p.relative_to(CONFIG_DIR)): sha256(p) for p in sorted(CONFIG_DIR.rglob("*.yaml"))}
        self.manifest.set(
            "inputs",
            {
                "golden": golden,
                "pi1_sft": self.cfg.pi1_sft,
                "pi2_sft": self.cfg.pi2_sft,
                "base_model": self.cfg.base_model,
                "sft_overrides": list(self.cfg.sft_overrides),
                "profile": self.cfg.profile,
                "limit": self.cfg.limit,
                "overrides": list(self.cfg.overrides),
                "reward_url": self.cfg.reward_url,
                "c1_reward_url": self.cfg.c1_reward_url,
                "pi1_pipe_url": self.cfg.pi1_pipe_url,
                "rft": {"k": self.cfg.rft_k, "threshold": self.cfg.rft_threshold} if self.cfg.rft else None,
            },
        )
        self.manifest.set("configs", configs)

    def build_data(self) -> None:
        from trainer.data.datasets import build_datasets

        phases = [*self.sft_phases(), *(p for p in BUILD_PHASES if p not in SFT_PHASES)]
        if all((self.data / p / "train.parquet").is_file() for p in phases):
            return
        counts = build_datasets(self.cfg.golden, self.data, phases, limit=self.cfg.limit)
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

        models.update(zip(todo, self.side_by_side([job(n) for n in todo]), strict=True))
        pi1, pi2 = models["a1"], models["a2"]
        assert pi1 and pi2
        return pi1, pi2

    def phase(
        self,
        name: str,
        model: str,
        reward_url: str | None,
        out_dir: Path,
        data_dir: Path | None = None,
        placement: Placement | None = None,
    ) -> str:
        """Run one phase unless its recorded output exists; record it; the exported HF directory.

        ``placement`` (GPU profile): the phase's GPUs and the overrides they imply; the user's
        overrides come after them and win.
        """
        key = str(out_dir.relative_to(self.out))
        inputs = self.phase_inputs(name, model, data_dir or self.data)
        done = phase_done(out_dir)
        recorded_inputs = _read_json(out_dir / PHASE_INPUTS)
        if done is not None and recorded_inputs is not None and recorded_inputs != inputs:
            raise StaleResultError(
                f"phase {key}: its recorded result was trained from other inputs (recorded {recorded_inputs}, "
                f"now {inputs}); move {out_dir} aside to train it again from the current ones"
            )
        if done is None:
            sft = get_phase(name).kind == "sft"
            if not sft and self.cfg.preflight_min is not None and reward_url:
                self.preflight(name, model, reward_url, out_dir, placement)
            placed: tuple[str, ...] = ()
            if placement is not None:
                placed = placement.sft_overrides() if sft else placement.grpo_overrides()
            run = PhaseRun(
                phase=get_phase(name),
                profile=self.cfg.profile,
                data_dir=data_dir or self.data,
                out_dir=out_dir,
                model_path=model,
                reward_url=reward_url,
                overrides=(*placed, *(self.cfg.sft_overrides if sft else self.cfg.overrides)),
                nproc=placement.nproc if placement else 1,
                gpus=placement.gpus if placement else (),
            )
            done = self.runner(run)
            if done.status != "ok" or not done.hf_dir:
                self.manifest.set(f"phase:{key}", asdict(done))
                why = f": {done.error}" if done.error else ""
                raise RuntimeError(f"phase {key} failed (exit {done.exit_code}){why}; log {out_dir / 'train.log'}")
            (out_dir / PHASE_INPUTS).write_text(json.dumps(inputs, indent=2) + "\n")
        self.manifest.set(f"phase:{key}", asdict(done))
        assert done.hf_dir is not None
        return done.hf_dir

    def preflight(self, name: str, model: str, reward_url: str, out_dir: Path, placement: Placement | None) -> None:
        """The advantage check of ``name``'s start policy; stops the loop when its groups teach too little."""
        from trainer.phases.preflight import advantage_check, write_report

        slot = ExecutorSlot(placement.gpus[:1], 0.3) if placement else None
        key = str(out_dir.relative_to(self.out))
        with serve_model(
            model, self.out / "logs" / f"executor_preflight_{name}.log", slot, eager=self.cfg.executor_eager
        ) as ep:
            rep = advantage_check(
                self.cfg.golden, reward_of(name), ep.url, ep.served_name, reward_url,
                min_informative=float(self.cfg.preflight_min or 0.0), max_tokens=self.cfg.eval_max_tokens,
            )  # fmt: skip
        write_report(rep, out_dir / "preflight.json")
        self.manifest.set(f"preflight:{key}", rep.as_dict())
        if not rep.ok:
            raise RuntimeError(
                f"phase {key}: {rep.verdict()} Raise the rollout temperature or n, filter the prompts "
                f"(trainer preflight-filter), or start from another policy (report: {out_dir / 'preflight.json'})"
            )

    @contextlib.contextmanager
    def reward_api(
        self,
        executor_model: str | None,
        external: str | None,
        tag: str,
        slots: Sequence[ExecutorSlot | None] = (None,),
    ) -> Iterator[str]:
        """The external URL if given, else local services (executors only when a model is given: one
        replica per slot, on its GPU; ``(None,)`` is one vLLM-CPU executor).

        An external reward API whose executor must serve ``executor_model`` is checked first
        (:func:`~trainer.serving.identity.check_reward_api_url`); the manifest records what it serves.
        """
        logs = self.out / "logs"
        with serve_reward_api(
            logs / f"reward_api_{tag}.log",
            executor_model=executor_model,
            executor_logs=replica_logs(logs / f"executor_{tag}", len(slots)),
            slots=slots,
            external=external,
            what=f"{tag} reward API",
            eager=self.cfg.executor_eager,
            max_tokens=self.cfg.executor_max_tokens,
            workers=self.cfg.reward_workers,
        ) as api:
            if api.identity is not None:
                self.manifest.set(f"served:{tag}", api.identity.as_dict())
            yield api.url

    def phase_inputs(self, name: str, model: str, data_dir: Path) -> dict[str, Any]:
        """What a phase's result depends on: its start model's content and its data files."""
        files = sorted((data_dir / name).glob("*.parquet")) if (data_dir / name).is_dir() else []
        return {"model_in": fingerprint(model), "data": {f.name: sha256(f) for f in files}}

    def golden_sha256(self, splits: Sequence[str]) -> dict[str, str]:
        return {s: sha256(self.cfg.golden / f"common_{s}_schemas.jsonl") for s in splits}

    def precompute_key(self, pi1_pipe: str) -> dict[str, Any]:
        """What the C2 data depends on: π1ʳ-pipe's content, the golden files, the settings."""
        from shared import PROMPT_VERSION

        return {
            "schema_model": fingerprint(pi1_pipe),
            "golden": self.golden_sha256(("train", "validation")),
            "config": {
                "limit": self.cfg.limit,
                "max_tokens": self.cfg.eval_max_tokens,
                "on_invalid": "gold",
                "prompt_version": PROMPT_VERSION,
                "train_prompts": self.cfg.c2_train_prompts,
            },
        }

    def precompute(self, pi1_pipe: str, data_dir: Path, tag: str) -> None:
        """C2's data from π1ʳ-pipe's schemas; reused only if its key (model content, golden, config) matches."""
        from trainer.data.precompute import precompute_c2
        from trainer.evaluation.generation import GenerationClient, GenerationConfig
        from trainer.evaluation.inference import schema_predictor

        key = self.precompute_key(pi1_pipe)
        key_path = data_dir / "c2" / PRECOMPUTE_KEY
        if (data_dir / "c2" / "train.parquet").is_file() and _read_json(key_path) == key:
            return
        gen = GenerationConfig(max_tokens=self.cfg.eval_max_tokens)
        slot = ExecutorSlot(self.plan.gpus[:1]) if self.plan else None
        log = self.out / "logs" / f"executor_precompute_{tag}.log"
        external, what = self.cfg.pi1_pipe_url, f"precompute {tag} (π1ʳ-pipe)"
        with serve_model(pi1_pipe, log, slot, external=external, what=what, eager=self.cfg.executor_eager) as ep:
            served = ep.identity.as_dict() if ep.identity else None
            if served is not None:
                self.manifest.set(f"served:precompute_{tag}", served)
            rep = precompute_c2(
                self.cfg.golden,
                data_dir,
                schema_predictor(GenerationClient(ep.url, ep.served_name, gen)),
                ep.served_name,
                on_invalid="gold",
                limit=self.cfg.limit,
                sample={"train": self.cfg.c2_train_prompts} if self.cfg.c2_train_prompts else None,
            )
        key_path.write_text(json.dumps(key, indent=2) + "\n")
        self.manifest.set(f"precompute:{tag}", asdict(rep) | {"schema_model": pi1_pipe, "key": key, "served": served})

    def evaluate(self, settings: dict[str, tuple[str, str]], tag: str, compare: tuple[str, str]) -> dict[str, Any]:
        """Phase D: each setting's π1 then π2, served one at a time; returns the loop-2 decision.

        ``compare`` = (previous, last): the loop-2 rule's gain is ``last`` over ``previous``.
        """
        from shared import read_golden
        from trainer.evaluation.phase_d import write_outputs

        out = self.out / f"eval_{tag}"
        key = self.eval_key(settings)
        if (out / "metrics.json").is_file() and _read_json(out / EVAL_KEY) == key:
            recorded = json.loads((out / "metrics.json").read_text())
            if set(recorded["settings"]) == set(settings):
                # scores are reused; the decision follows the current rule (metric, min gain, pair)
                cfg = self.cfg
                decision = redecide(out, recorded, f"Phase D ({tag})", cfg.decision_metric, cfg.min_gain, compare)
                self.manifest.set(f"eval:{tag}", {"dir": str(out), "loop2": decision})
                return decision
        examples = read_golden(self.cfg.golden / "common_test_schemas.jsonl", self.cfg.eval_limit)
        preds: dict[str, list[dict[str, Any]]] = {}
        if self.plan is None:
            preds = {name: self.staged_pipeline(name, pi1, pi2, examples) for name, (pi1, pi2) in settings.items()}
        else:
            # settings side by side, one GPU each (π1 then π2 on it), in waves of at most one per GPU
            slots = self.plan.eval_slots(len(settings))
            for wave in waves(list(settings), len(slots)):
                with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                    futures = {
                        name: pool.submit(self.staged_pipeline, name, *settings[name], examples, slot)
                        for name, slot in zip(wave, slots, strict=False)
                    }
                    preds.update({name: f.result() for name, f in futures.items()})
            preds = {name: preds[name] for name in settings}  # report order = settings order
        res = write_outputs(
            out, examples, preds, f"Phase D ({tag})", self.cfg.decision_metric, self.cfg.min_gain, compare=compare
        )
        (out / EVAL_KEY).write_text(json.dumps(key, indent=2) + "\n")
        self.manifest.set(
            f"eval:{tag}",
            {"dir": str(out), "settings": settings, "metrics": str(res.metrics_path), "loop2": res.decision},
        )
        return res.decision

    def eval_key(self, settings: dict[str, tuple[str, str]]) -> dict[str, Any]:
        """What Phase D's scores depend on: every setting's model contents, the test file, the settings."""
        from shared import PROMPT_VERSION

        return {
            "settings": {name: [fingerprint(pi1), fingerprint(pi2)] for name, (pi1, pi2) in settings.items()},
            "golden": self.golden_sha256(("test",)),
            "config": {
                "eval_limit": self.cfg.eval_limit,
                "max_tokens": self.cfg.eval_max_tokens,
                "prompt_version": PROMPT_VERSION,
            },
        }

    def staged_pipeline(
        self, name: str, pi1: str, pi2: str, examples: Sequence[Any], slot: ExecutorSlot | None = None
    ) -> list[dict[str, Any]]:
        """Stage 1 with π1 served alone, then Stage 2 with π2 on the predicted schemas (on ``slot``)."""
        from trainer.evaluation.generation import GenerationConfig
        from trainer.evaluation.two_stage import PromptStage, generate_quietly, run_two_stage

        def serve(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
            log = self.out / "logs" / f"executor_eval_{name}_{'pi1' if stage == 'stage1' else 'pi2'}.log"
            return serve_model(model, log, slot, eager=self.cfg.executor_eager)

        gen = GenerationConfig(max_tokens=self.cfg.eval_max_tokens)
        return run_two_stage(name, pi1, pi2, examples, serve, gen, generate_quietly)

    def run(self) -> dict[str, Any]:
        """The whole loop, or up to ``until``'s part; a rerun goes on from the last finished part."""
        try:
            return self._run()
        except StopAfter as stop:
            self.manifest.set("stopped_after", str(stop))
            return self.manifest.data

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.record_inputs()
        self.build_data()
        pi1_sft, pi2_sft = self.sft()
        rft = self.rft_baseline(pi1_sft, pi2_sft) if cfg.rft else None
        self.finished("sft")
        with self.reward_api(None, cfg.reward_url, "local") as url:
            pi1_local, pi2_local = self.side_by_side(
                [
                    lambda place: self.phase("b1", pi1_sft, url, self.out / "b1", placement=place),
                    lambda place: self.phase("b2", pi2_sft, url, self.out / "b2", placement=place),
                ]
            )
        self.finished("local")
        pi1_pipe, pi2_pipe = self.pipeline_round(pi1_local, pi2_local, "loop1")
        settings = {"sft": (pi1_sft, pi2_sft), "local": (pi1_local, pi2_local), "pipe": (pi1_pipe, pi2_pipe)}
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

    def rft_baseline(self, pi1_sft: str, pi2_sft: str) -> tuple[str, str]:
        """RFT of π1ˢ (schema reward) and π2ˢ (table reward): sample, keep the best, SFT on them."""
        from trainer.phases.registry import RewardKind
        from trainer.rft import RftConfig, build_rft_data

        gen = RftConfig(k=self.cfg.rft_k, threshold=self.cfg.rft_threshold, max_tokens=self.cfg.eval_max_tokens)
        models: dict[str, str] = {}
        starts: tuple[tuple[RewardKind, str], ...] = (("schema", pi1_sft), ("table", pi2_sft))
        for reward, start in starts:
            base = self.out / "rft" / reward
            phase = sft_phase_for(reward)
            if phase_done(base / "sft") is None and not (base / "data" / phase / "train.parquet").is_file():
                logs = self.out / "logs"
                with (
                    serve_model(start, logs / f"executor_rft_{reward}.log") as ep,
                    self.reward_api(None, self.cfg.reward_url, f"rft_{reward}") as url,
                ):
                    rep = build_rft_data(
                        self.cfg.golden, base, reward, ep.url, ep.served_name, url, gen, self.cfg.limit
                    )
                self.manifest.set(f"rft:{reward}", rep.as_dict() | {"policy": start})
            models[reward] = self.phase(phase, start, None, base / "sft", data_dir=base / "data")
        return models["schema"], models["table"]

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
        with self.reward_api(pi2_start, self.cfg.c1_reward_url, f"c1_{tag}", slots) as url:
            pi1_pipe = self.phase("c1", pi1_start, url, base / "c1", data, placement=trainer)
        if tag == "loop1":
            self.finished("c1")
        self.precompute(pi1_pipe, data, tag)
        with self.reward_api(None, self.cfg.reward_url, f"c2_{tag}") as url:
            pi2_pipe = self.phase("c2", pi2_start, url, base / "c2", data, placement=self.whole())
        if tag == "loop1":
            self.finished("c2")
        return pi1_pipe, pi2_pipe

    def _link_c1_data(self, data: Path) -> None:
        """Loop 2 re-uses loop 1's C1 data but gets its own C2 (new π1 schemas)."""
        (data / "c1").parent.mkdir(parents=True, exist_ok=True)
        if not (data / "c1").exists():
            (data / "c1").symlink_to((self.data / "c1").resolve(), target_is_directory=True)


def redecide(
    out: Path, recorded: dict[str, Any], title: str, metric: str, min_gain: float, compare: tuple[str, str]
) -> dict[str, Any]:
    """The loop-2 decision over recorded Phase-D metrics; rewrites metrics.json and report.md if it changed."""
    from trainer.evaluation.phase_d import loop2_decision
    from trainer.evaluation.report import markdown_report

    decision = loop2_decision(recorded["settings"], metric, min_gain, compare)
    if decision != recorded.get("loop2"):
        recorded["loop2"] = decision
        (out / "metrics.json").write_text(json.dumps(recorded, indent=2) + "\n")
        report = markdown_report(recorded["settings"], decision, title, recorded.get("paired_tests"))
        (out / "report.md").write_text(report)
    return decision


def _read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is none (a key never written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

"""Every recipe's settings, each declared once: :class:`RunConfig` holds what the recipes share, :class:`LoopConfig`
(``trainer loop``) and :class:`ExperimentConfig` (``trainer experiment pi1-ab|pi2-ab``) add their own. A field is its
command's option (:func:`trainer.config_cli.option`: same name, help and default) and the run record holds the
config whole."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shared.limits import TABLE_ANSWER_MAX_TOKENS
from trainer.checks.preflight import PreflightSize
from trainer.config_cli import cli_meta, csv_values, field_like, option
from trainer.data.sft_mix import SourceMix, SourceMixError
from trainer.data.train_mix import check_restricted, check_share, rl_mix_share_field
from trainer.evaluation.generation import GenerationSettings
from trainer.phases.launch import PROFILES, Profile
from trainer.phases.token_overrides import check_no_token
from trainer.registry.phases import GRPO_PHASES, SFT_PHASES

# The loop's parts, in order (``--until``): a run stops after the named part; a rerun goes on from there.
PARTS = ("sft", "local", "c1", "c2", "eval")
ControlMode = Literal["serial", "parallel", "off"]
CONTROL_MODES: tuple[ControlMode, ...] = ("serial", "parallel", "off")


def csv_option(help: str, default: str = "") -> Any:
    """A tuple field given as one comma-separated option."""
    return option(csv_values(default), help, cli_type=str, cli_default=default)


@dataclass(kw_only=True)
class RunConfig:
    golden: Path = field(
        metadata=cli_meta(help="Golden folder (common_{split}_schemas.jsonl).", exists=True, file_okay=False)
    )
    out: Path | None = option(None, "The run's folder (resumable: a rerun reuses its finished work). Default: "
                              "runs/RECIPE")  # fmt: skip
    profile: Profile = option("gpu", f"One of {list(PROFILES)} (cpu-smoke: everything on CPU through the CPU shim, "
                              "phases in turn).", cli_type=str)  # fmt: skip
    gpus: tuple[str, ...] = option(
        (), "gpu profile: the GPU ids to use, e.g. 0,1 (docs/training.md says how phases are placed on them). Default: "
        "CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists.", cli_type=str | None, cli_default=None,
    )  # fmt: skip
    base_model: str | None = option(None, "Start model of A1/A2 (default: SmolLM2-135M-Instruct, converted once).")
    limit: int | None = option(None, "First N examples per split (data build).", min=1)
    strict_splits: bool = option(False, "Stop before any phase when golden splits share a document (same id, or same "
                                 "text once whitespace is collapsed and case folded). Default: the train rows that "
                                 "repeat a validation or test document are dropped and named (data build "
                                 "--strict-splits).")  # fmt: skip
    sft_mix: str | None = option(None, "A1/A2's train split reweighted by source, SOURCE=WEIGHT,... (data build "
                                 "--sft-mix).")  # fmt: skip
    sft_overrides: tuple[str, ...] = option((), "Hydra override for A1/A2 (repeatable).", option="sft_override",
                                            cli_type=list[str], cli_default=[])  # fmt: skip
    rl_extra: tuple[str, ...] = option((), "Hydra override for every GRPO phase (repeatable; after the recipe's own, "
                                       "so it wins).", cli_type=list[str], cli_default=[])  # fmt: skip
    # WikiTableText is where the headroom is; validation keeps every source, so early stopping guards the others.
    rl_sources: tuple[str, ...] = csv_option(
        "Comma-separated sources every GRPO phase trains on (default: every source of its train split); validation "
        "keeps every source. C2's schemas and the preflight draw their documents from them, an improvable set is "
        "restricted to them."
    )
    rl_mix_share: float = rl_mix_share_field()
    rl_seed: int | None = option(None, "Seed of every RL phase: prompt order, sampling, mini-batches (default: "
                                 "VERL's).", min=0)  # fmt: skip
    reward_max_tokens: int = option(TABLE_ANSWER_MAX_TOKENS, "Max new tokens of the pipeline reward's executor (C1's "
                                    "Stage 2 with the frozen π2).", min=1)  # fmt: skip
    reward_workers: int | None = option(None, "uvicorn workers of each reward API the run starts (default: 1 on CPU; "
                                        "on GPUs 4, 8 for the pipeline reward).", min=1)  # fmt: skip
    # --executor-cuda-graphs = not eager: a 135M model's executors start in well under a minute without compiling
    executor_eager: bool = field_like(GenerationSettings, "eager", "GPU executors with CUDA graphs + torch.compile "
                                      "(slower start; for larger models). Default: eager.",
                                      option="executor_cuda_graphs",
                                      cli_default=not GenerationSettings.eager)  # fmt: skip
    c2_train_prompts: int = option(4096, "C2's schemas: a seeded N train documents (and every validation one); VERL "
                                   "draws data.train_max_samples prompts from them.", min=1)  # fmt: skip
    eval_limit: int | None = option(None, "First N test documents in Phase D (default: all).", min=1)
    eval_max_tokens: int = field_like(GenerationSettings, "max_tokens", "Max new tokens of the run's own generation: "
                                      "Phase D, C2's schemas, the preflight, RFT.")  # fmt: skip
    eval_max_truncated_share: float = option(0.02, "Phase D fails when more than this share of a setting's schemas or "
                                             "tables stop at the max tokens (a cut answer would be scored as wrong).",
                                             min=0.0, max=1.0)  # fmt: skip
    eval_max_refused_share: float = option(0.02, "Phase D fails when the executor refuses (HTTP 400, e.g. a prompt "
                                           "over its context) more than this share of a setting's prompts (a "
                                           "refused document is scored as wrong).", min=0.0, max=1.0)  # fmt: skip
    eval_concurrency: int = field_like(GenerationSettings, "concurrency")
    eval_timeout_s: float = field_like(GenerationSettings, "timeout_s")
    preflight_prompts: int = field_like(PreflightSize, "prompts", "Preflight (the loop's --preflight-min, the "
                                        "experiments' sweep): training prompts per source.")  # fmt: skip
    preflight_n: int = field_like(PreflightSize, "n", "Preflight: samples per prompt (rollout.n).")

    def __post_init__(self) -> None:
        check_share(self.rl_mix_share)
        # before the run record (which holds the config) is written
        check_no_token(self.sft_overrides, "--sft-override")
        check_no_token(self.rl_extra, "--rl-extra (and the overrides after the options)")

    def folder(self, recipe: str) -> Path:
        return self.out or Path("runs") / recipe

    @property
    def executor_prefix_caching(self) -> bool:
        """Whether the run's executors cache prefixes: never (GenerationSettings.prefix_caching; no option)."""
        return GenerationSettings.prefix_caching

    def workers(self, pipeline: bool) -> int:
        if self.reward_workers:
            return self.reward_workers
        return 1 if self.profile != "gpu" else 8 if pipeline else 4


@dataclass(kw_only=True)
class LoopConfig(RunConfig):
    pi1_sft: str | None = option(None, "π1ˢ (an A1 output). Default: run A1 from --base-model.")
    pi2_sft: str | None = option(None, "π2ˢ (an A2 output). Default: run A2 from --base-model.")
    reward_url: str | None = option(None, "Reward API for B1/B2/C2 (default: start one locally).")
    c1_reward_url: str | None = option(None, "Reward API whose executor serves π2ʳ-local (cluster).")
    pi1_pipe_url: str | None = option(None, "Executor serving π1ʳ-pipe for C2's schemas (cluster).")
    loops: int = option(1, "2: run C1→C2 again if loop 1 gained ≥ --min-gain.", min=1, max=2)
    min_gain: float = option(1.0, "Loop-2 rule: stop when the end-to-end gain is below this (points).")
    # = trainer.evaluation.phase_d.DEFAULT_DECISION_METRIC (not imported: the config stays light)
    decision_metric: str = option("aligned_cell_f1", "Loop-2 rule: the macro metric whose gain decides (as "
                                  "`evaluate pipeline`).")  # fmt: skip
    eval_base: bool = option(True, "Phase D also scores the base model (π1 = π2 = --base-model), when one is given.")
    rft: bool = option(False, "Also train the RFT baseline from π1ˢ/π2ˢ and add it to Phase D.")
    rft_k: int = option(4, "RFT: samples per prompt.", min=1)
    rft_threshold: float = option(0.5, "RFT: keep the best sample if reward ≥ this.", min=-1.0, max=1.0)
    until: str | None = option(None, f"Stop after this part of the loop ({', '.join(PARTS)}); a rerun goes on from "
                               "there.")  # fmt: skip
    preflight_min: float | None = option(
        None, "Before each GRPO phase: stop unless this share of groups has rewards that differ and at least 10% of "
        "prompts (macro over sources) have a sample that beats the greedy answer (no headroom otherwise).",
        min=0.0, max=1.0,
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.until is not None and self.until not in PARTS:
            raise ValueError(f"until: must be one of {list(PARTS)}, got {self.until!r}")
        check_restricted(self.rl_mix_share, bool(self.rl_sources), "--rl-sources")


@dataclass(kw_only=True)
class ExperimentConfig(RunConfig):
    sft_from: Path | None = option(None, "Another experiment's folder whose data build and SFT (data/, a1/, a2/) this "
                                   "one reuses as they are (not compared with this run's settings); it must have "
                                   "finished them and built this experiment's data phases.",
                                   exists=True, file_okay=False)  # fmt: skip
    data_phases: tuple[str, ...] = csv_option("Comma-separated phases `data build` writes (default: a1,a2 and the arms "
                                              "built from golden data); add another experiment's (e.g. b2) for its "
                                              "--sft-from.")  # fmt: skip
    temps: tuple[float, ...] = option((1.0, 1.3, 1.6), "Comma-separated rollout temperatures the preflight sweeps.",
                                      cli_type=str, cli_default="1.0,1.3,1.6")  # fmt: skip
    preflight_phases: tuple[str, ...] = csv_option("Comma-separated RL phases the preflight sweeps (default: b1,c1 for "
                                                   "pi1-ab, b2 for pi2-ab).")  # fmt: skip
    preflight_sources: tuple[str, ...] = csv_option("Comma-separated sources the preflight samples (default: every "
                                                    "source of the train split).")  # fmt: skip
    min_share: float = option(0.10, "The rollout temperature: the lowest swept one at which every swept phase has at "
                              "least this macro improvable share; a phase below it has no headroom.", min=0.0,
                              max=1.0)  # fmt: skip
    force_rl: bool = option(False, "Train even where a swept phase has no headroom (else stop there).")
    min_source_share: float = option(0.0, "preflight-filter: keep only the sources whose improvable share reaches "
                                     "this.", min=0.0, max=1.0)  # fmt: skip
    rl_improvable: bool = option(False, "Train each arm on its phase's improvable prompts where they fill one batch "
                                 "(else on the train split, with a message).")  # fmt: skip
    control: ControlMode = option("serial", "Arm A's positive control on its improvable prompts: serial (before RL; a "
                                  "failed control stops the experiment), parallel (beside RL) or off.",
                                  cli_type=str)  # fmt: skip
    control_stagger_s: float = option(150.0, "control parallel: RL starts this long after the control (three rollout "
                                      "engines starting at once on one GPU lost one).", min=0.0)  # fmt: skip
    rl_steps: int = option(10, "GRPO steps of each arm.", min=1)
    rl_test_freq: int = option(5, "Validation (and a checkpoint) every N steps (at most --rl-steps).", min=1)
    rl_micro: int = option(32, "gpu profile: micro batch (samples) of the actor update and both log-prob passes (the "
                           "profile's 16 is sized for 8 GPUs; one GPU per arm needs fewer, larger passes).",
                           min=1)  # fmt: skip
    rl_stagger_s: float = option(90.0, "The second arm starts this long after the first, only where both share a GPU.",
                                 min=0.0)  # fmt: skip
    dry_run: bool = option(False, "Print the plan (parts, phases' commands, GPUs) and run nothing.")

    def __post_init__(self) -> None:
        if self.control not in CONTROL_MODES:
            raise ValueError(f"control: must be one of {list(CONTROL_MODES)}, got {self.control!r}")
        bad = [p for p in self.preflight_phases if p not in GRPO_PHASES]
        if bad:
            raise ValueError(f"preflight_phases: {bad} are no GRPO phases {list(GRPO_PHASES)}")
        bad = [p for p in self.data_phases if p not in (*SFT_PHASES, *GRPO_PHASES) or p == "c2"]
        if bad:
            raise ValueError(f"data_phases: {bad} cannot be built from golden data")
        if not self.temps:
            raise ValueError("temps: give at least one temperature")
        super().__post_init__()
        check_restricted(self.rl_mix_share, bool(self.rl_sources) or self.rl_improvable,
                         "--rl-sources or --rl-improvable")  # fmt: skip


def from_cli(values: dict[str, Any]) -> dict[str, Any]:
    """The command line's comma-separated and list forms turned into the fields' tuples."""
    for f in ("data_phases", "preflight_phases", "preflight_sources", "rl_sources", "held_out"):
        if f in values:
            values[f] = csv_values(values[f])
    if "temps" in values:
        values["temps"] = tuple(float(t) for t in csv_values(values["temps"]))
    for f in ("sft_overrides", "rl_extra", "candidates", "candidate_overrides"):
        if f in values:
            values[f] = tuple(values[f] or ())
    values["executor_eager"] = not values["executor_eager"]  # the option is --executor-cuda-graphs
    return values


@dataclass(frozen=True)
class Candidate:
    """An SFT recipe of ``trainer experiment sft-choice``: a name and the source mix of A1/A2's train split."""

    name: str
    mix: SourceMix
    overrides: tuple[str, ...] = ()  # its own SFT overrides (--candidate-override NAME:OVERRIDE)

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """``NAME`` or ``NAME:SOURCE=WEIGHT,...``; the error names ``candidate`` and the reason."""
        name, _, mix = text.partition(":")
        name = name.strip()
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"candidate: {text!r}: NAME[:SOURCE=WEIGHT,...], a name of lower-case letters, digits, _")
        if not mix.strip():
            return cls(name, SourceMix())
        try:
            return cls(name, SourceMix.parse(mix))
        except SourceMixError as exc:
            raise ValueError(f"candidate: {name}: {str(exc).removeprefix('--sft-mix: ')}") from None

    def without(self, source: str | None) -> SourceMix | None:
        """The mix trained on with ``source`` held out (its weight 0); None: the split as it is."""
        if source is None:
            return self.mix if self.mix.weights else None
        return SourceMix({**self.mix.weights, source: 0.0}, self.mix.seed)


@dataclass(kw_only=True)
class SftChoiceConfig(RunConfig):
    candidates: tuple[str, ...] = option(
        ("golden",), "An SFT recipe to compare, NAME[:SOURCE=WEIGHT,...] (repeatable): a name and the source mix of "
        "A1/A2's train split (data build --sft-mix; none: the split as it is); its own SFT settings are "
        "--candidate-override's, the rest the run's (--sft-override).", option="candidate", cli_type=list[str],
        cli_default=["golden"],
    )  # fmt: skip
    candidate_overrides: tuple[str, ...] = option(
        (), "A candidate's own SFT override, NAME:KEY=VALUE (repeatable; e.g. epochs:trainer.total_epochs=4), before "
        "--sft-override's, which apply to every candidate.", option="candidate_override", cli_type=list[str],
        cli_default=[],
    )  # fmt: skip
    held_out: tuple[str, ...] = csv_option("Comma-separated sources each candidate is also trained without and scored "
                                           "on (default: every source of the train split).")  # fmt: skip
    val_limit: int | None = option(None, "First N validation documents per source scored (default: all).", min=1)
    dry_run: bool = option(False, "Print the plan (candidates, held-out sources, phases, Phase D) and run nothing.")

    def __post_init__(self) -> None:
        if self.sft_mix:
            raise ValueError("sft_mix: each candidate names its own mix (--candidate NAME:SOURCE=WEIGHT,...)")
        names = [c.name for c in self.parsed_candidates()]
        if not names:
            raise ValueError("candidate: give at least one")
        if len(set(names)) != len(names):
            raise ValueError(f"candidate: names repeat: {names}")
        check_no_token(self.candidate_overrides, "--candidate-override")
        super().__post_init__()

    def parsed_candidates(self) -> list[Candidate]:
        """The candidates, each with its own overrides; a bad override names ``candidate_override`` and why."""
        found = [Candidate.parse(text) for text in self.candidates]
        own: dict[str, list[str]] = {c.name: [] for c in found}
        for text in self.candidate_overrides:
            name, sep, override = text.partition(":")
            if not sep or "=" not in override:
                raise ValueError(f"candidate_override: {text!r}: NAME:KEY=VALUE")
            if name not in own:
                raise ValueError(f"candidate_override: {text!r}: {name!r} is none of the candidates {list(own)}")
            own[name].append(override.strip())
        return [dataclasses.replace(c, overrides=tuple(own[c.name])) for c in found]

"""The loop's settings, declared once: :class:`LoopConfig`'s fields with their help text are the options of
``python -m trainer loop`` (``trainer/loop_cli.py`` builds them from here) and the manifest records the
config whole (``manifest.py``).

A field's metadata is :func:`trainer.config_cli.cli_meta`'s (help text, and how the option differs from the
field); ``cli=False`` marks the one field that is not an option (the trailing Hydra overrides).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shared.limits import EVAL_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS
from trainer.config_cli import cli_meta
from trainer.phases.launch import PROFILES, Profile
from trainer.phases.train_mix import check_restricted, check_share, rl_mix_share_field

# The loop's parts, in order (``--until``): a run stops after the named part; a rerun goes on from there.
# (The manifest keeps its keys ``done:<part>`` / ``time:<part>``: what a run on a node reports per part.)
PARTS = ("sft", "local", "c1", "c2", "eval")


@dataclass
class LoopConfig:
    golden: Path = field(
        metadata=cli_meta(help="Golden folder (common_{split}_schemas.jsonl).", exists=True, file_okay=False)
    )
    out: Path = field(default=Path("runs/loop"), metadata=cli_meta(help="Loop folder (resumable)."))
    profile: Profile = field(
        default="gpu", metadata=cli_meta(help=f"One of {list(PROFILES)} (cpu-smoke loads the CPU shim).", cli_type=str)
    )
    pi1_sft: str | None = field(
        default=None, metadata=cli_meta(help="π1ˢ (an A1 output). Default: run A1 from --base-model.")
    )
    pi2_sft: str | None = field(
        default=None, metadata=cli_meta(help="π2ˢ (an A2 output). Default: run A2 from --base-model.")
    )
    base_model: str | None = field(
        default=None,
        metadata=cli_meta(
            help="Start model of A1/A2 when no SFT checkpoint is given. cpu-smoke default: SmolLM2-135M-Instruct."
        ),
    )
    sft_overrides: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="Hydra override for A1/A2 (repeatable); the trailing overrides go to RL phases.",
            option="sft_override",
            cli_type=list[str],
            cli_default=[],
        ),
    )
    reward_url: str | None = field(
        default=None, metadata=cli_meta(help="Reward API for B1/B2/C2 (default: start one locally).")
    )
    c1_reward_url: str | None = field(
        default=None, metadata=cli_meta(help="Reward API whose executor serves π2ʳ-local (cluster).")
    )
    pi1_pipe_url: str | None = field(
        default=None, metadata=cli_meta(help="Executor serving π1ʳ-pipe for C2 precompute (cluster).")
    )
    limit: int | None = field(default=None, metadata=cli_meta(help="First N examples per split (data).", min=1))
    sft_mix: str | None = field(
        default=None,
        metadata=cli_meta(help="A1/A2's train split reweighted by source, SOURCE=WEIGHT,... (data build --sft-mix)."),
    )
    eval_limit: int | None = field(default=None, metadata=cli_meta(help="First N test examples in Phase D.", min=1))
    loops: int = field(
        default=1, metadata=cli_meta(help="2: run C1→C2 again if loop 1 gained ≥ --min-gain.", min=1, max=2)
    )
    min_gain: float = field(
        default=1.0, metadata=cli_meta(help="Loop-2 rule: stop when the end-to-end gain is below this (points).")
    )
    # = trainer.evaluation.phase_d.DEFAULT_DECISION_METRIC (not imported: the config stays light)
    decision_metric: str = field(
        default="aligned_cell_f1",
        metadata=cli_meta(help="Loop-2 rule: the macro metric whose gain decides (as `evaluate pipeline`)."),
    )
    overrides: tuple[str, ...] = field(
        default=(), metadata=cli_meta(help="Hydra overrides of every RL phase (after the options).", cli=False)
    )
    rl_seed: int | None = field(
        default=None,
        metadata=cli_meta(
            help="Seed of every RL phase: prompt order, sampling, mini-batches (default: VERL's).", min=0
        ),
    )
    executor_max_tokens: int = field(
        default=TABLE_ANSWER_MAX_TOKENS,
        metadata=cli_meta(
            help="Max new tokens of the reward API's executor (C1's Stage 2 with the frozen π2): π2's table budget "
            "(shared.TABLE_ANSWER_MAX_TOKENS).",
            min=1,
        ),
    )
    eval_max_tokens: int = field(
        default=EVAL_ANSWER_MAX_TOKENS,
        metadata=cli_meta(
            help="Max new tokens of the loop's own generation: Phase D, C2 precompute, preflight, RFT; the evaluation "
            "answer's budget (shared.EVAL_ANSWER_MAX_TOKENS).",
            min=1,
        ),
    )
    eval_max_truncated_share: float = field(
        default=0.02,
        metadata=cli_meta(
            help=(
                "Phase D fails when more than this share of a setting's π1 schemas or π2 tables stop at the "
                "evaluation's max tokens (a cut answer would be scored as wrong)."
            ),
            min=0.0,
            max=1.0,
        ),
    )
    eval_base: bool = field(
        default=True,
        metadata=cli_meta(help="Phase D also scores the base model (π1 = π2 = --base-model), when one is given."),
    )
    rft: bool = field(
        default=False, metadata=cli_meta(help="Also train the RFT baseline from π1ˢ/π2ˢ and add it to Phase D.")
    )
    rft_k: int = field(default=4, metadata=cli_meta(help="RFT: samples per prompt.", min=1))
    rft_threshold: float = field(
        default=0.5, metadata=cli_meta(help="RFT: keep the best sample if reward ≥ this.", min=-1.0, max=1.0)
    )
    # GPU ids of this node (the gpu profile): phases are placed by trainer/serving/gpus.py. Empty: CPU.
    gpus: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="gpu profile: GPU ids to use (default: CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists).",
            cli_type=str | None,
            cli_default=None,
        ),
    )
    until: str | None = field(
        default=None,
        metadata=cli_meta(help=f"Stop after this part of the loop ({', '.join(PARTS)}); a rerun goes on from there."),
    )
    reward_workers: int = field(
        default=1, metadata=cli_meta(help="uvicorn workers of the reward_api the loop starts.", min=1)
    )
    # Before each GRPO phase: the share of groups whose rewards differ (trainer/phases/preflight.py);
    # below it, the phase is not started. None: no check.
    preflight_min: float | None = field(
        default=None,
        metadata=cli_meta(
            help="Before each GRPO phase: stop unless this share of groups has rewards that differ and at least 10% of "
            "prompts (macro over sources) have a sample that beats the greedy answer (no headroom otherwise).",
            min=0.0,
            max=1.0,
        ),
    )
    # C2's precompute: a seeded random sample of this many train documents (None: the whole split). VERL
    # draws data.train_max_samples prompts from the C2 train file; schemas for the rest are never used.
    c2_train_prompts: int | None = field(
        default=None,
        metadata=cli_meta(
            help="C2 precompute: a seeded random N train documents (default: all; VERL uses train_max_samples).",
            min=1,
        ),
    )
    # Each GRPO phase on its train split's prompts of these sources only (WikiTableText is where the headroom
    # is; a π2 A/B on a GPU node moved only so); C2's precompute draws its documents from them.
    rl_sources: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="Comma-separated sources every GRPO phase trains on (default: every source); validation keeps "
            "every source, and the C2 precompute and the preflight draw from these.",
            cli_type=str,
            cli_default="",
        ),
    )
    rl_mix_share: float = rl_mix_share_field()
    # GPU executors (C1's frozen π2, the C2 precompute, Phase D) without CUDA graphs / torch.compile: each
    # starts in well under a minute, where compilation costs more than it saves for a 135M model.
    executor_eager: bool = field(
        default=True,
        metadata=cli_meta(
            help="GPU executors with CUDA graphs + torch.compile (slower start; for larger models). Default: eager.",
            option="executor_cuda_graphs",  # the option says the opposite: --executor-cuda-graphs = not eager
            cli_default=False,
        ),
    )

    def __post_init__(self) -> None:
        if self.until is not None and self.until not in PARTS:
            raise ValueError(f"until: must be one of {list(PARTS)}, got {self.until!r}")
        check_share(self.rl_mix_share)
        check_restricted(self.rl_mix_share, bool(self.rl_sources), "--rl-sources")

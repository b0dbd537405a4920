"""The settings every recipe shares, each declared once: :class:`RunConfig`, which ``LoopConfig`` (``trainer loop``)
and ``ExperimentConfig`` (``trainer experiment pi1-ab|pi2-ab``) extend with their own. A field's metadata is
:func:`trainer.config_cli.cli_meta`'s, so each is the same option, with the same help and default, in every
recipe's command; the manifests record the config whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shared.limits import EVAL_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS
from trainer.config_cli import cli_meta
from trainer.phases.launch import PROFILES, Profile
from trainer.phases.train_mix import check_share, rl_mix_share_field


@dataclass(kw_only=True)
class RunConfig:
    golden: Path = field(
        metadata=cli_meta(help="Golden folder (common_{split}_schemas.jsonl).", exists=True, file_okay=False)
    )
    profile: Profile = field(
        default="gpu",
        metadata=cli_meta(
            help=f"One of {list(PROFILES)} (cpu-smoke: everything on CPU through the CPU shim, phases in turn).",
            cli_type=str,
        ),
    )
    # GPU ids of this node (the gpu profile): the recipe places its phases on them. Empty: every GPU, or CPU.
    gpus: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="gpu profile: the GPU ids to use, e.g. 0,1 (how the phases are placed on them: the recipe's docs). "
            "Default: CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists.",
            cli_type=str | None,
            cli_default=None,
        ),
    )
    base_model: str | None = field(
        default=None,
        metadata=cli_meta(help="Start model of A1/A2 (default: SmolLM2-135M-Instruct, converted once)."),
    )
    limit: int | None = field(default=None, metadata=cli_meta(help="First N examples per split (data build).", min=1))
    sft_mix: str | None = field(
        default=None,
        metadata=cli_meta(help="A1/A2's train split reweighted by source, SOURCE=WEIGHT,... (data build --sft-mix)."),
    )
    sft_overrides: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="Hydra override for A1/A2 (repeatable).", option="sft_override", cli_type=list[str], cli_default=[]
        ),
    )
    # Each GRPO phase on its train split's prompts of these sources only (WikiTableText is where the headroom
    # is); validation keeps every source, so early stopping still guards the others.
    rl_sources: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="Comma-separated sources every GRPO phase trains on (default: every source of its train split); "
            "validation keeps every source. The C2 schemas and the preflight draw their documents from them, and an "
            "improvable set (the experiments' --rl-improvable) is restricted to them.",
            cli_type=str,
            cli_default="",
        ),
    )
    rl_mix_share: float = rl_mix_share_field()
    rl_seed: int | None = field(
        default=None,
        metadata=cli_meta(
            help="Seed of every RL phase: prompt order, sampling, mini-batches (default: VERL's).", min=0
        ),
    )
    reward_max_tokens: int = field(
        default=TABLE_ANSWER_MAX_TOKENS,
        metadata=cli_meta(
            help="Max new tokens of the pipeline reward's executor (C1's Stage 2 with the frozen π2): π2's table "
            "budget (shared.TABLE_ANSWER_MAX_TOKENS).",
            min=1,
        ),
    )
    eval_limit: int | None = field(
        default=None, metadata=cli_meta(help="First N test documents in Phase D (default: all).", min=1)
    )
    eval_max_tokens: int = field(
        default=EVAL_ANSWER_MAX_TOKENS,
        metadata=cli_meta(
            help="Max new tokens of the run's own generation: Phase D, the C2 schemas, the preflight, RFT; the "
            "evaluation answer's budget (shared.EVAL_ANSWER_MAX_TOKENS).",
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

    def __post_init__(self) -> None:
        check_share(self.rl_mix_share)

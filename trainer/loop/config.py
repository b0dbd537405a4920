"""The loop's settings, declared once: :class:`LoopConfig`'s fields (its own, and those every recipe shares from
:class:`trainer.runs.config.RunConfig`) with their help text are the options of ``python -m trainer loop``
(``trainer/loop_cli.py`` builds them from here) and the manifest records the config whole (``manifest.py``).

A field's metadata is :func:`trainer.config_cli.cli_meta`'s (help text, and how the option differs from the
field); ``cli=False`` marks the one field that is not an option (the trailing Hydra overrides).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer.config_cli import cli_meta
from trainer.phases.train_mix import check_restricted
from trainer.runs.config import RunConfig

# The loop's parts, in order (``--until``): a run stops after the named part; a rerun goes on from there.
# (The manifest keeps its keys ``done:<part>`` / ``time:<part>``: what a run on a node reports per part.)
PARTS = ("sft", "local", "c1", "c2", "eval")


@dataclass(kw_only=True)
class LoopConfig(RunConfig):
    """The loop's own settings beside :class:`~trainer.runs.config.RunConfig`'s."""

    out: Path = field(default=Path("runs/loop"), metadata=cli_meta(help="Loop folder (resumable)."))
    pi1_sft: str | None = field(
        default=None, metadata=cli_meta(help="π1ˢ (an A1 output). Default: run A1 from --base-model.")
    )
    pi2_sft: str | None = field(
        default=None, metadata=cli_meta(help="π2ˢ (an A2 output). Default: run A2 from --base-model.")
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
        super().__post_init__()
        if self.until is not None and self.until not in PARTS:
            raise ValueError(f"until: must be one of {list(PARTS)}, got {self.until!r}")
        check_restricted(self.rl_mix_share, bool(self.rl_sources), "--rl-sources")

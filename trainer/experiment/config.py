"""An experiment's settings, declared once: :class:`ExperimentConfig`'s fields (its own, and those every recipe
shares from :class:`trainer.runs.config.RunConfig`) with their help text are the options of ``python -m trainer
experiment pi1-ab|pi2-ab`` (``cli.py`` builds them with :mod:`trainer.config_cli`), and the experiment's manifest
records the config whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shared.limits import EVAL_ANSWER_MAX_TOKENS
from trainer.config_cli import cli_meta, csv_values
from trainer.phases.registry import GRPO_PHASES, SFT_PHASES
from trainer.phases.train_mix import check_restricted
from trainer.runs.config import RunConfig

ControlMode = Literal["serial", "parallel", "off"]
CONTROL_MODES: tuple[ControlMode, ...] = ("serial", "parallel", "off")


@dataclass(kw_only=True)
class ExperimentConfig(RunConfig):
    """An experiment's own settings beside :class:`~trainer.runs.config.RunConfig`'s."""

    workdir: Path = field(
        default=Path("runs/ab"),
        metadata=cli_meta(help="The experiment's folder: every stage's result lands here; a rerun skips a stage "
                          "whose result exists."),
    )  # fmt: skip
    sft_from: Path | None = field(
        default=None,
        metadata=cli_meta(
            help="Another experiment's workdir whose data build and SFT (data/, a1/, a2/) this one reuses; it must "
            "have finished them and built this experiment's data phases.",
            exists=True,
            file_okay=False,
        ),
    )
    data_phases: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(
            help="Comma-separated phases `data build` writes (default: a1,a2 and the arms built from golden data); "
            "add another experiment's (e.g. b2) for its --sft-from.",
            cli_type=str,
            cli_default="",
        ),
    )
    temps: tuple[float, ...] = field(
        default=(1.0, 1.3, 1.6),
        metadata=cli_meta(help="Comma-separated rollout temperatures the preflight sweeps.", cli_type=str,
                          cli_default="1.0,1.3,1.6"),
    )  # fmt: skip
    preflight_phases: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(help="Comma-separated RL phases the preflight sweeps (default: b1,c1 for pi1-ab, b2 for "
                          "pi2-ab).", cli_type=str, cli_default=""),
    )  # fmt: skip
    preflight_prompts: int = field(default=64, metadata=cli_meta(help="Preflight: training prompts per source.", min=1))
    preflight_sources: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(help="Comma-separated sources the preflight samples (default: every source of the train "
                          "split); e.g. wikitabletext with a large --preflight-prompts for a large improvable set "
                          "there.", cli_type=str, cli_default=""),
    )  # fmt: skip
    preflight_n: int = field(default=16, metadata=cli_meta(help="Preflight: samples per prompt (rollout.n).", min=2))
    preflight_max_tokens: int = field(
        default=EVAL_ANSWER_MAX_TOKENS,
        metadata=cli_meta(help="Preflight: max tokens a sample (shared.EVAL_ANSWER_MAX_TOKENS).", min=1),
    )
    min_share: float = field(
        default=0.10,
        metadata=cli_meta(help="The rollout temperature: the lowest swept one at which every swept phase has at least "
                          "this macro improvable share; a phase below it has no headroom.", min=0.0, max=1.0),
    )  # fmt: skip
    force_rl: bool = field(
        default=False, metadata=cli_meta(help="Train even where a swept phase has no headroom (else stop there).")
    )
    min_source_share: float = field(
        default=0.0,
        metadata=cli_meta(help="preflight-filter: keep only the sources whose improvable share reaches this.",
                          min=0.0, max=1.0),
    )  # fmt: skip
    rl_improvable: bool = field(
        default=False,
        metadata=cli_meta(help="Train each arm on its phase's improvable prompts where they fill one batch (else "
                          "on the train split, with a message)."),
    )  # fmt: skip
    control: ControlMode = field(
        default="serial",
        metadata=cli_meta(help="Arm A's positive control on its improvable prompts: serial (before RL; a failed "
                          "control stops the experiment), parallel (beside RL) or off.", cli_type=str),
    )  # fmt: skip
    control_stagger_s: float = field(
        default=150.0,
        metadata=cli_meta(help="control parallel: RL starts this long after the control (three rollout engines "
                          "starting at once on one GPU lost one).", min=0.0),
    )  # fmt: skip
    c2_train_sample: int = field(
        default=4096,
        metadata=cli_meta(help="pi2-ab: π1ˢ writes the schemas of a seeded N train documents (and every "
                          "validation one).", min=1),
    )  # fmt: skip
    rl_steps: int = field(default=10, metadata=cli_meta(help="GRPO steps of each arm.", min=1))
    rl_test_freq: int = field(
        default=5, metadata=cli_meta(help="Validation (and a checkpoint) every N steps (at most --rl-steps).", min=1)
    )
    rl_micro: int = field(
        default=32,
        metadata=cli_meta(help="gpu profile: micro batch (samples) of the actor update and both log-prob passes "
                          "(the profile's 16 is sized for 8 GPUs; one GPU per arm needs fewer, larger passes).",
                          min=1),
    )  # fmt: skip
    rl_extra: tuple[str, ...] = field(
        default=(),
        metadata=cli_meta(help="Hydra override for both arms (repeatable; after the experiment's own).",
                          cli_type=list[str], cli_default=[]),
    )  # fmt: skip
    rl_stagger_s: float = field(
        default=90.0,
        metadata=cli_meta(help="The second arm starts this long after the first, only where both share a GPU.",
                          min=0.0),
    )  # fmt: skip
    eval_concurrency: int = field(default=256, metadata=cli_meta(help="Concurrent requests per executor.", min=1))
    eval_timeout_s: float = field(default=600.0, metadata=cli_meta(help="Timeout of one request (s).", min=1.0))
    dry_run: bool = field(
        default=False, metadata=cli_meta(help="Print the plan (stages, phases' commands, GPUs) and run nothing.")
    )

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
        restricted = bool(self.rl_sources) or self.rl_improvable
        check_restricted(self.rl_mix_share, restricted, "--rl-sources or --rl-improvable")

    @classmethod
    def from_cli(cls, **values: Any) -> ExperimentConfig:
        """The command line's comma-separated forms turned into the fields' tuples."""
        for name in ("data_phases", "preflight_phases", "preflight_sources", "rl_sources"):
            values[name] = csv_values(values[name])
        values["temps"] = tuple(float(t) for t in csv_values(values["temps"]))
        for name in ("sft_overrides", "rl_extra"):
            values[name] = tuple(values[name] or ())
        return cls(**values)

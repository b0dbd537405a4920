"""What the demo runs: sample, generation length, the brief A1/A2 SFT and the short C1 GRPO phase, in one place.

The SFT numbers were chosen on this 2-core machine so that the SFT models clear the demo's targets on the
held-out sample documents, and the GRPO numbers so that the whole demo fits in twelve minutes (README,
"Measured"). ``python -m trainer demo`` exposes all but ``val_samples`` and ``max_share`` as options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer.data.e2e_sample import E2E_SAMPLE_DIR

# Max tokens of every demo generation (Stage 1, Stage 2 and the reward API's executor): the CPU demo's override
# of shared.EVAL_ANSWER_MAX_TOKENS and TABLE_ANSWER_MAX_TOKENS, so that the whole demo fits in about ten minutes;
# the base model's answers cut at it are counted in the report.
DEMO_MAX_TOKENS = 96

# The demo's pass marks, measured on the held-out sample documents (the sft setting).
TARGETS = {"schema_valid": 0.9, "aligned_cell_f1": 0.5}


@dataclass(frozen=True)
class SftSettings:
    """A brief VERL SFT (``trainer run a1|a2 --profile cpu-smoke`` plus these overrides)."""

    steps: int = field(default=8, metadata={"help": "Optimizer steps of each of A1 and A2."})
    batch: int = field(default=4, metadata={"help": "Examples per step (one micro-batch)."})
    lr: float = field(default=1e-4, metadata={"help": "Peak learning rate."})
    val_samples: int = field(default=8, metadata={"help": "Validation examples of VERL's final val/loss."})

    def overrides(self) -> list[str]:
        return [
            f"trainer.total_training_steps={self.steps}",
            f"data.train_batch_size={self.batch}",
            f"data.micro_batch_size_per_gpu={self.batch}",
            f"optim.lr={self.lr}",
            # VERL validates on the whole validation file after the last step: minutes on 2 cores.
            f"data.val_max_samples={self.val_samples}",
            # The export needs the weights only; the 1 GB optimizer state is never resumed here.
            "checkpoint.save_contents=[model,extra]",
        ]


@dataclass(frozen=True)
class RlSettings:
    """A short C1 GRPO phase (``trainer run c1 --profile cpu-smoke`` plus these overrides): π1ˢ trained on the
    pipeline reward, the frozen π2ˢ filling each sampled schema through reward_api and its executor."""

    steps: int = field(default=4, metadata={"help": "GRPO steps of C1."})
    prompts: int = field(default=2, metadata={"help": "Training prompts per step."})
    samples: int = field(default=4, metadata={"help": "Samples per prompt (the GRPO group)."})
    lr: float = field(default=1e-5, metadata={"help": "Actor learning rate."})
    val_samples: int = field(
        default=8, metadata={"help": "Validation prompts, scored before the first step and after the last."}
    )
    # Mask mode (the default): a table the executor cut at the demo's max_tokens is never trained on and is counted
    # per step (report.md). A step of 8 samples would stop at the first such sample under the phases' 0.1.
    max_share: float = field(
        default=0.5,
        metadata={"help": "failures.max_share of C1: the largest share of masked samples a step may have."},
    )

    def overrides(self) -> list[str]:
        return [
            f"trainer.total_training_steps={self.steps}",
            f"failures.max_share={self.max_share}",
            # validated and saved once, after the last step: each validation is a rollout and reward calls
            f"trainer.test_freq={self.steps}",
            f"trainer.save_freq={self.steps}",
            "trainer.val_before_train=true",  # the curve's start: the validation reward of π1ˢ
            f"data.train_batch_size={self.prompts}",
            f"data.val_max_samples={self.val_samples}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={self.prompts}",
            f"actor_rollout_ref.rollout.n={self.samples}",
            f"actor_rollout_ref.actor.optim.lr={self.lr}",
        ]


@dataclass(frozen=True)
class DemoSettings:
    out: Path = field(default=Path("demo_out"), metadata={"help": "Output folder."})
    sample: Path = field(default=E2E_SAMPLE_DIR, metadata={"help": "Golden folder (default: the bundled E2E sample)."})
    eval_limit: int | None = field(default=None, metadata={"help": "First N test documents (default: all)."})
    max_tokens: int = field(
        default=DEMO_MAX_TOKENS, metadata={"help": "max_tokens of every generation (the demo's CPU-sized override)."}
    )
    base_model: str | None = field(default=None, metadata={"help": "Base model HF dir (default: SmolLM2-135M)."})
    sft: SftSettings = field(default_factory=SftSettings)
    rl: RlSettings = field(default_factory=RlSettings)
    retrain: bool = field(default=False, metadata={"help": "Train A1, A2 and C1 again even if matching models exist."})

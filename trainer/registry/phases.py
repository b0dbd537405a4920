"""The phase registry: one entry per training phase owns every fact about it (docs/training.md#phases).

Each entry says which trainer runs the phase (SFT or GRPO), which policy it trains (π1 writes the
schema, π2 fills the table), how its data is built (the prompt and what the reward is checked
against), which reward it trains on and its SFT partner (the SFT phase that trains the same policy
from the base model; RFT of that reward trains as it). The maps other modules need (phase → reward
kind, reward kind → SFT phase, the phases ``data build`` writes, the ``ability`` column) are derived
here, never written out a second time; ``tests/trainer/registry/test_phases.py`` checks every phase
config (``configs/<phase>_{sft,grpo}.yaml``) against these entries.

May import ``shared`` only: every part of ``trainer`` may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared import SCHEMA_ANSWER_MAX_TOKENS, TABLE_ANSWER_MAX_TOKENS

# The reward_api endpoint a GRPO phase trains on, and the part of ``data_source`` before ``:``.
RewardKind = Literal["schema", "table", "pipeline"]
REWARD_KINDS: tuple[RewardKind, ...] = ("schema", "table", "pipeline")
Policy = Literal["pi1", "pi2"]
# The prompt of a phase's rows: Stage 1 on the document, Stage 2 on the gold schema, or Stage 2 on the
# schema π1 predicted (C2: built by ``trainer data precompute-schemas`` from a served π1).
Prompt = Literal["stage1", "stage2_gold", "stage2_predicted"]
# What a row's reward is checked against (``reward_model.ground_truth``); SFT rows hold the gold target.
Truth = Literal["schema", "table", "text"]

# ``ability`` column of the RL rows, per policy.
ABILITY: dict[Policy, str] = {"pi1": "schema_extraction", "pi2": "table_extraction"}


@dataclass(frozen=True)
class Phase:
    name: str
    kind: Literal["sft", "grpo"]
    policy: Policy
    prompt: Prompt
    # GRPO: what the reward is checked against (the keys of the row's ground_truth); SFT: none.
    ground_truth: tuple[Truth, ...]
    # GRPO: the reward kind (endpoint, data_source prefix, early_stopping.data_source); SFT: None.
    reward: RewardKind | None
    sft_partner: str
    # GRPO: data.max_response_length of the phase config, the budget of the policy's answer (shared.limits);
    # SFT: None.
    max_response_length: int | None
    trains: str
    objective: str
    output: str

    @property
    def config_name(self) -> str:
        return f"{self.name}_{self.kind}"

    @property
    def built_from_golden(self) -> bool:
        """``trainer data build`` writes this phase's data (C2 needs π1's predicted schemas instead)."""
        return self.prompt != "stage2_predicted"


PHASES: dict[str, Phase] = {
    p.name: p
    for p in (
        Phase(
            "a1", "sft", policy="pi1", prompt="stage1", ground_truth=(), reward=None, sft_partner="a1",
            max_response_length=None, trains="π1 from the base model (Stage 1: document → schema)",
            objective="cross-entropy on gold schemas", output="π1ˢ",
        ),
        Phase(
            "a2", "sft", policy="pi2", prompt="stage2_gold", ground_truth=(), reward=None, sft_partner="a2",
            max_response_length=None, trains="π2 from the base model (Stage 2: gold schema → table)",
            objective="cross-entropy on gold tables", output="π2ˢ",
        ),
        Phase(
            "b1", "grpo", policy="pi1", prompt="stage1", ground_truth=("schema",), reward="schema", sft_partner="a1",
            max_response_length=SCHEMA_ANSWER_MAX_TOKENS, trains="π1 from π1ˢ",
            objective="schema reward vs gold schema", output="π1ʳ-local",
        ),
        Phase(
            "b2", "grpo", policy="pi2", prompt="stage2_gold", ground_truth=("table",), reward="table",
            sft_partner="a2", max_response_length=TABLE_ANSWER_MAX_TOKENS,
            trains="π2 from π2ˢ, prompts with gold schemas", objective="table reward vs gold table", output="π2ʳ-local",
        ),
        Phase(
            "c1", "grpo", policy="pi1", prompt="stage1", ground_truth=("schema", "table", "text"), reward="pipeline",
            sft_partner="a1", max_response_length=SCHEMA_ANSWER_MAX_TOKENS, trains="π1 from π1ʳ-local",
            objective="a·schema + (1−a)·table via the frozen π2ʳ-local executor", output="π1ʳ-pipe",
        ),
        Phase(
            "c2", "grpo", policy="pi2", prompt="stage2_predicted", ground_truth=("table",), reward="table",
            sft_partner="a2", max_response_length=TABLE_ANSWER_MAX_TOKENS,
            trains="π2 from π2ʳ-local, schemas precomputed by π1ʳ-pipe", objective="table reward vs gold table",
            output="π2ʳ-pipe",
        ),
    )
}

SFT_PHASES: tuple[str, ...] = tuple(p.name for p in PHASES.values() if p.kind == "sft")
GRPO_PHASES: tuple[str, ...] = tuple(p.name for p in PHASES.values() if p.kind == "grpo")
# What ``trainer data build`` writes (C2: ``trainer data precompute-schemas``).
BUILD_PHASES: tuple[str, ...] = tuple(p.name for p in PHASES.values() if p.built_from_golden)


def get_phase(name: str) -> Phase:
    try:
        return PHASES[name.lower()]
    except KeyError:
        raise ValueError(f"phase must be one of {list(PHASES)}, got {name!r}") from None


def reward_of(name: str) -> RewardKind:
    """The reward kind a GRPO phase trains on."""
    phase = get_phase(name)
    if phase.reward is None:
        raise ValueError(f"phase {phase.name} trains on no reward: choose a GRPO phase {list(GRPO_PHASES)}")
    return phase.reward


def sft_phase_for(reward: str) -> str:
    """The SFT phase that trains the policy a reward kind scores (RFT on that reward trains as it)."""
    partners = {p.sft_partner for p in PHASES.values() if p.reward == reward}
    if len(partners) != 1:
        raise ValueError(f"reward kind must be one of {list(REWARD_KINDS)}, got {reward!r}")
    return partners.pop()


def reward_prompt(reward: RewardKind) -> Prompt:
    """The prompt a reward kind is sampled on outside training (preflight, RFT): that of the phase with
    golden data and this reward (``table``: Stage 2 on the gold schema, as B2)."""
    return next(p.prompt for p in PHASES.values() if p.reward == reward and p.built_from_golden)

"""What each A/B experiment compares, as data: its two arms, the policy they train from,
the phases its preflight sweeps, and the settings its evaluation scores. Every other fact (a phase's
reward, its policy, its SFT partner) is the phase registry's.

- ``pi1-ab``: from π1ˢ, arm A = B1 (schema reward), arm B = C1 (pipeline reward, π2ˢ frozen in an
  executor); Phase D scores sft, local (B1's π1 + π2ˢ) and pipe (C1's π1 + π2ˢ) end to end.
- ``pi2-ab``: from π2ˢ, arm A = B2 (Stage-2 prompts on gold schemas), arm B = C2 (on schemas π1ˢ wrote);
  π2 is scored on gold schemas (sft, local = B2, pipe = C2), then end to end with π1ˢ writing the schemas.

Not the loop's order (there C1 starts from π1ʳ-local and its executor serves π2ʳ-local): the start policy
and the frozen partner stay fixed, so the only difference between the arms is the reward (π1) or the
schemas of the prompts (π2).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.phases.registry import SFT_PHASES, get_phase

# Each phase's output under these names in served model names, logs and the report.
SETTINGS = ("sft", "local", "pipe")


@dataclass(frozen=True)
class Design:
    name: str
    arms: tuple[str, str]  # arm A (local reward or gold schemas), arm B (pipeline reward or predicted schemas)
    preflight: tuple[str, ...]  # the phases swept by default (C2 has no golden prompts of its own)

    @property
    def start(self) -> str:
        """The SFT phase whose output both arms train from (π1ˢ: A1, π2ˢ: A2)."""
        return get_phase(self.arms[0]).sft_partner

    @property
    def partner(self) -> str:
        """The other SFT phase: the frozen policy of the experiment (π2ˢ in C1's reward, π1ˢ writing C2's schemas)."""
        (other,) = [p for p in SFT_PHASES if p != self.start]
        return other

    @property
    def policy(self) -> str:
        return get_phase(self.start).policy

    @property
    def c2_data(self) -> bool:
        """An arm trains on schemas π1ˢ wrote (``trainer data precompute-schemas``)."""
        return any(get_phase(a).prompt == "stage2_predicted" for a in self.arms)

    @property
    def data_phases(self) -> tuple[str, ...]:
        """What ``trainer data build`` writes for it: both SFT phases and the arms built from golden data."""
        return (*SFT_PHASES, *(a for a in self.arms if get_phase(a).built_from_golden))

    @property
    def gold_schema_eval(self) -> bool:
        """π2 is also scored on gold schemas (the B2 target), apart from π1's mistakes."""
        return self.policy == "pi2"

    @property
    def stage1_eval(self) -> bool:
        """π1's schemas are scored alone first (the B1 target; Phase D's Stage 2 comes after)."""
        return self.policy == "pi1"

    def served_name(self, phase: str) -> str:
        """The name an executor serves a phase's output under: ``pi1-sft``, ``pi2-local``, ``pi1-pipe`` ..."""
        setting = {self.arms[0]: "local", self.arms[1]: "pipe"}.get(phase, "sft")
        return f"{get_phase(phase).policy}-{setting}"

    def settings(self) -> dict[str, tuple[str, str]]:
        """Phase D: setting → (π1, π2), each named by the phase whose output it is."""
        out = {}
        for name, trained in zip(SETTINGS, (self.start, *self.arms), strict=True):
            pair = {self.start: trained, self.partner: self.partner}
            out[name] = (pair["a1"], pair["a2"])
        return out


DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design("pi1-ab", arms=("b1", "c1"), preflight=("b1", "c1")),
        Design("pi2-ab", arms=("b2", "c2"), preflight=("b2",)),
    )
}

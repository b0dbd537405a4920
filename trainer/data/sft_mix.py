"""The source mix of the SFT train split: how often each golden source's examples enter A1/A2's data.

The golden train split is what the sources give (RotoWire sentences 64% of it, WikiTableText 28%, E2E 8%),
and one epoch of it sees each WikiTableText example once while the model has long learnt RotoWire's fixed
26 columns. A mix reweights the sources: ``wikitabletext=2,rotowire_sent=0.5`` puts every WikiTableText
example in twice and a seeded half of RotoWire's in once; a source it does not name keeps weight 1.

- A weight ``w`` gives ``floor(w)`` copies of every example of the source plus a seeded sample of
  ``round(frac(w) * n)`` of them, in the golden file's order (VERL's SFT loader shuffles). 0 drops the source.
- Only the SFT phases' **train** split is mixed: validation stays the golden split, so the choice of a mix
  on validation is made on the data a user is scored on.
- The mix, its seed and the counts per source before and after go to the data manifest.

The source of an example is its id's prefix (:func:`shared.golden.source_of`): a mix names the sources of the
golden data at hand, never a fixed list.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import GoldenExample
from shared.golden import source_of


class SourceMixError(ValueError):
    """A mix that cannot be applied: the message names the field (``--sft-mix``) and the reason."""


@dataclass(frozen=True)
class SourceMix:
    weights: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        for source, w in self.weights.items():
            if not source:
                raise SourceMixError("--sft-mix: an empty source name")
            if not math.isfinite(w) or w < 0:
                raise SourceMixError(f"--sft-mix: {source}={w}: a weight is a finite number >= 0")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> SourceMix:
        """``SOURCE=WEIGHT[,SOURCE=WEIGHT...]`` (``wikitabletext=2,rotowire_sent=0.5``)."""
        weights: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            source, sep, value = part.partition("=")
            source = source.strip()
            if not sep:
                raise SourceMixError(f"--sft-mix: {part!r}: expected SOURCE=WEIGHT")
            if source in weights:
                raise SourceMixError(f"--sft-mix: {source} is named twice")
            try:
                weights[source] = float(value)
            except ValueError:
                raise SourceMixError(f"--sft-mix: {source}={value!r}: the weight is not a number") from None
        if not weights:
            raise SourceMixError(f"--sft-mix: {text!r} names no source (SOURCE=WEIGHT[,SOURCE=WEIGHT...])")
        return cls(weights, seed)

    def spec(self) -> str:
        return ",".join(f"{s}={w:g}" for s, w in self.weights.items())

    def apply(self, examples: Sequence[GoldenExample]) -> list[GoldenExample]:
        """The mixed train examples; every source the mix names must be in ``examples``."""
        by_source: dict[str, list[GoldenExample]] = {}
        for ex in examples:
            by_source.setdefault(source_of(ex.id), []).append(ex)
        absent = sorted(set(self.weights) - set(by_source))
        if absent:
            raise SourceMixError(f"--sft-mix: no train example of {absent}; the sources are {sorted(by_source)}")
        out: list[GoldenExample] = []
        for source, group in by_source.items():
            w = self.weights.get(source, 1.0)
            copies, frac = int(w), w - int(w)
            out.extend(group * copies)
            extra = round(frac * len(group))
            if extra:
                rng = random.Random(f"{self.seed}:{source}")
                out.extend(group[i] for i in sorted(rng.sample(range(len(group)), extra)))
        if not out:
            raise SourceMixError(f"--sft-mix: {self.spec()} leaves no train example")
        return out

    def describe(self, before: Sequence[GoldenExample], after: Sequence[GoldenExample]) -> dict[str, Any]:
        """What the manifest records: the mix, its seed, and the examples per source before and after."""
        return {
            "weights": dict(self.weights),
            "seed": self.seed,
            "train_before": dict(Counter(source_of(ex.id) for ex in before)),
            "train_after": dict(Counter(source_of(ex.id) for ex in after)),
        }


def recorded_mix(data_dir: Path) -> dict[str, Any] | None:
    """The mix that the SFT data in ``data_dir`` was built with (its manifest), or None (no mix, or no data)."""
    path = data_dir / "manifest.json"
    if not path.is_file():
        return None
    phases = json.loads(path.read_text()).get("phases", {})
    for phase in ("a1", "a2"):
        if phase in phases:
            mix: dict[str, Any] | None = phases[phase].get("sft_mix")
            return mix
    return None


def check_reuse(data_dir: Path, mix: SourceMix | None) -> None:
    """Data already built in ``data_dir`` is reused only if it was built with the mix asked for."""
    recorded = recorded_mix(data_dir)
    was = (recorded["weights"], recorded["seed"]) if recorded else None
    now = (dict(mix.weights), mix.seed) if mix else None
    if was != now:

        def say(x: tuple[dict[str, float], int] | None) -> str:
            return "no mix" if x is None else f"{SourceMix(x[0], x[1]).spec()} (seed {x[1]})"

        raise SourceMixError(
            f"--sft-mix: {data_dir} holds SFT data built with {say(was)}, asked for {say(now)}: "
            "build into another folder (a new workdir) or remove it"
        )

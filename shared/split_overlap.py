"""Documents shared between the golden splits (docs/golden_data.md, "Splits share no document").

Two examples are the same document when they share an ``id`` or their texts are equal once whitespace runs are
collapsed to one space and the text is casefolded (:func:`text_key`). A train row that repeats a validation or
test document would be trained on and evaluated on; :class:`SplitOverlap` finds such rows and names them.

The policy the callers apply (``python -m shared validate``, ``trainer data build``, ``trainer loop``):

- by default the train rows that repeat a held-out (validation or test) document are dropped, counted and named;
  validation and test stay as they are, so results stay comparable across builds;
- with ``--strict-splits`` any overlap (train~validation, train~test, validation~test) is refused
  (:class:`SplitOverlapError`, one line naming the ids);
- an empty split is an error (:class:`EmptySplitError`) either way;
- documents repeated *within* train are counted, not dropped: they do not leak an evaluated document, and in the
  project's data every repeated text carries different gold tables (distinct examples with the same wording).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.golden import SPLITS, EmptySplitError, GoldenExample, golden_filename, iter_golden, read_golden

HELD_OUT = ("validation", "test")
KEY_DESCRIPTION = "same id, or same sha256 of the text with whitespace collapsed and casefolded"
SHOWN_IDS = 20


def text_key(text: str) -> str:
    """sha256 (hex) of ``text`` with every whitespace run collapsed to one space, stripped and casefolded."""
    return hashlib.sha256(" ".join(text.split()).casefold().encode("utf-8")).hexdigest()


class SplitOverlapError(ValueError):
    """``--strict-splits``: two splits share a document; the message is one line naming the ids."""


def shown(ids: Sequence[str], n: int = SHOWN_IDS) -> str:
    """The first ``n`` ids, comma-separated, and how many more there are."""
    head = ", ".join(ids[:n])
    return head + (f" and {len(ids) - n} more" if len(ids) > n else "")


@dataclass
class PairOverlap:
    """Documents of split ``other`` found in split ``base``: the ids of ``other`` that share an id or a text with
    ``base``, and the ids of ``base`` they share it with."""

    base: str
    other: str
    other_ids: list[str] = field(default_factory=list)
    base_ids: list[str] = field(default_factory=list)
    shared_ids: list[str] = field(default_factory=list)  # the same id in both (a subset of other_ids)

    @property
    def name(self) -> str:
        return f"{self.base}~{self.other}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "documents": len(self.other_ids),
            f"{self.other}_ids": self.other_ids,
            f"{self.base}_ids": self.base_ids,
            "shared_ids": self.shared_ids,
        }


@dataclass
class Repeats:
    """Texts that occur more than once within one split."""

    texts: int = 0  # distinct texts seen more than once
    extra_rows: int = 0  # rows beyond the first of each such text
    ids: list[list[str]] = field(default_factory=list)  # the ids of each repeated text

    def as_dict(self) -> dict[str, Any]:
        return {"texts": self.texts, "extra_rows": self.extra_rows, "ids": self.ids}


@dataclass
class SplitOverlap:
    """What :func:`find_overlaps` found: sizes, the overlaps between every two splits, the train rows that repeat
    a held-out document, and the repeats within each split."""

    sizes: dict[str, int]
    pairs: list[PairOverlap]
    train_drop: list[str]  # train ids that share an id or a text with validation or test
    repeats: dict[str, Repeats]

    def pair(self, base: str, other: str) -> PairOverlap | None:
        return next((p for p in self.pairs if (p.base, p.other) == (base, other)), None)

    @property
    def clean(self) -> bool:
        return not any(p.other_ids for p in self.pairs)

    def counts(self) -> dict[str, int]:
        """Documents of each pair's second split found in its first (``train~test``: test documents in train)."""
        return {p.name: len(p.other_ids) for p in self.pairs}

    def refusal(self) -> str:
        """The one-line ``--strict-splits`` error."""
        parts = [
            f"{p.name}: {len(p.other_ids)} {p.other} documents also in {p.base} ({shown(p.other_ids)}; "
            f"{p.base} ids {shown(p.base_ids)})"
            for p in self.pairs
            if p.other_ids
        ]
        return f"splits share documents ({KEY_DESCRIPTION}): " + "; ".join(parts)

    def summary(self) -> str:
        """One line: what overlaps, what is dropped, what repeats within train."""
        overlaps = ", ".join(f"{name} {n}" for name, n in self.counts().items()) or "no pair"
        rep = self.repeats.get("train", Repeats())
        return (
            f"documents shared ({overlaps}); {len(self.train_drop)} train rows repeat a validation or test document "
            f"(dropped from training data){': ' + shown(self.train_drop) if self.train_drop else ''}; "
            f"{rep.texts} train texts occur more than once ({rep.extra_rows} extra rows, kept)"
        )

    def as_dict(self, strict: bool = False) -> dict[str, Any]:
        """What the data manifest and the run record hold under ``split_overlap``."""
        return {
            "key": KEY_DESCRIPTION,
            "strict": strict,
            "sizes": self.sizes,
            "pairs": {p.name: p.as_dict() for p in self.pairs},
            "dropped_train": {"count": len(self.train_drop), "ids": self.train_drop},
            "repeats": {s: r.as_dict() for s, r in self.repeats.items()},
        }


def _keys(ex: GoldenExample) -> tuple[str, str]:
    return ex.id, text_key(ex.text)


def find_overlaps(splits: Mapping[str, Sequence[GoldenExample]]) -> SplitOverlap:
    """Overlaps between every two of ``splits`` (in :data:`shared.golden.SPLITS` order; any of them may be left
    out), the train rows to drop, and the texts repeated within each split."""
    names = [s for s in SPLITS if s in splits] + [s for s in splits if s not in SPLITS]
    by_id: dict[str, dict[str, list[str]]] = {}
    by_text: dict[str, dict[str, list[str]]] = {}
    repeats: dict[str, Repeats] = {}
    for name in names:
        ids: dict[str, list[str]] = defaultdict(list)
        texts: dict[str, list[str]] = defaultdict(list)
        for ex in splits[name]:
            ex_id, key = _keys(ex)
            ids[ex_id].append(ex_id)
            texts[key].append(ex_id)
        by_id[name], by_text[name] = ids, texts
        groups = [g for g in texts.values() if len(g) > 1]
        repeats[name] = Repeats(len(groups), sum(len(g) - 1 for g in groups), groups)
    pairs = []
    for i, base in enumerate(names):
        for other in names[i + 1 :]:
            pair = PairOverlap(base, other)
            hit_base: set[str] = set()
            for ex in splits[other]:
                ex_id, key = _keys(ex)
                found = {*by_id[base].get(ex_id, []), *by_text[base].get(key, [])}
                if found:
                    pair.other_ids.append(ex_id)
                    hit_base |= found
                    if ex_id in by_id[base]:
                        pair.shared_ids.append(ex_id)
            pair.base_ids = [ex.id for ex in splits[base] if ex.id in hit_base]
            pairs.append(pair)
    drop: set[str] = set()
    for p in pairs:
        if p.base == "train" and p.other in HELD_OUT:
            drop |= set(p.base_ids)
    train_drop = [ex.id for ex in splits.get("train", []) if ex.id in drop]
    sizes = {name: len(splits[name]) for name in names}
    return SplitOverlap(sizes, pairs, train_drop, repeats)


def check_not_empty(folder: Path | str, splits: Iterable[str] = SPLITS) -> None:
    """Every split file of ``folder`` exists and holds at least one example (:class:`EmptySplitError`,
    ``FileNotFoundError`` otherwise); reads only up to the first example of each."""
    for split in splits:
        path = Path(folder) / golden_filename(split)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: golden split file is missing")
        if next(iter_golden(path), None) is None:
            raise EmptySplitError(f"{path}: the {split} split is empty (no examples)")


def read_overlaps(folder: Path | str, train_limit: int | None = None) -> SplitOverlap:
    """:func:`find_overlaps` over the three split files of ``folder`` (train: its first ``train_limit`` rows, as
    ``data build --limit`` reads it; validation and test whole); an empty or missing split is an error."""
    check_not_empty(folder)
    return find_overlaps(
        {s: read_golden(Path(folder) / golden_filename(s), train_limit if s == "train" else None) for s in SPLITS}
    )


def train_examples(folder: Path | str, limit: int | None = None) -> list[GoldenExample]:
    """The train documents that are trained on: the first ``limit`` of the train split less those that repeat a
    validation or test document; for what samples training prompts outside ``data build`` (RFT, the preflight)."""
    check_not_empty(folder)
    full = {s: read_golden(Path(folder) / golden_filename(s), limit if s == "train" else None) for s in SPLITS}
    drop = set(find_overlaps(full).train_drop)
    kept = [ex for ex in full["train"] if ex.id not in drop]
    if not kept:
        raise EmptySplitError(f"{Path(folder) / golden_filename('train')}: every train row repeats a validation or "
                              "test document")  # fmt: skip
    return kept


def check_splits(report: SplitOverlap, strict: bool) -> SplitOverlap:
    """``report`` back, or :class:`SplitOverlapError` where ``strict`` and two splits share a document."""
    if strict and not report.clean:
        raise SplitOverlapError(report.refusal())
    return report

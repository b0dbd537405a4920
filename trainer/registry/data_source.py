"""The ``data_source`` of an RL sample: ``<reward kind>:<golden source>`` (``table:wikitabletext``).

VERL groups its validation metrics by ``data_source`` (``val-core/<data_source>/<key>/mean@N``), so putting
the golden source (the id's prefix, :func:`shared.golden.source_of`) there gives every validation metric
per source for free. The reward kind before the ``:`` (``schema``, ``table`` or ``pipeline``) picks the
reward API endpoint; a bare kind (``table``, data built before sources were tagged) is still accepted.
"""

from __future__ import annotations

from shared.golden import source_of

SEP = ":"


def data_source(kind: str, example_id: str) -> str:
    """``<kind>:<source of the id>``."""
    return f"{kind}{SEP}{source_of(example_id)}"


def reward_kind(data_source: str) -> str:
    """The reward kind of a data_source: the part before ``:`` (the whole string when untagged)."""
    return data_source.split(SEP, 1)[0]


def source_part(data_source: str) -> str | None:
    """The golden source of a data_source, or ``None`` when untagged."""
    _, sep, source = data_source.partition(SEP)
    return source if sep else None


def belongs_to(data_source: str, kind: str) -> bool:
    """Whether ``data_source`` is ``kind`` itself or one of its per-source tags."""
    return data_source == kind or data_source.startswith(kind + SEP)

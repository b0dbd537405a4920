"""A share of the other sources' prompts mixed into a GRPO phase's chosen train set (``--rl-mix-share``).

Why: B2 trained on WikiTableText alone (``--rl-sources``, or an improvable set of it) lost points on E2E,
whose gold takes its value spellings from the meaning representation; with no E2E or RotoWire prompt in
its batches, π2 drifts there. A share of their prompts keeps it practising them.

The contract, for a share ``F`` (``0 <= F < 1``; 0, the default, changes nothing: no file is written and
the phase trains on its chosen set as before):

- The chosen set (``--rl-sources``' set, or the improvable set the phase trains on) is kept whole; its
  sources are those its rows have.
- ``round(F * n / (1 - F))`` prompts are added to its ``n``, so they make share ``F`` of the final set,
  drawn from the phase's train split rows of every source **not** in the chosen set.
- They are spread **evenly** over those sources, not in proportion to their size: E2E, the small source
  and the one that drifted, gets as many as RotoWire. A source with fewer prompts than its part gives all
  it has and the others make up the rest; too few prompts over all of them is an error.
- Each source's prompts are drawn without replacement, seeded by ``MIX_SEED`` and the source, and kept in
  the train file's order, after the chosen rows (VERL shuffles its train loader).
- The file's Arrow schema metadata (``train_mix``) and the run's manifest record the share, the seed, the
  chosen set (path, SHA-256) and the prompts per source: chosen, drawn and in all.
- Only phases built from golden data (B1, B2, C1) are mixed: C2's train split holds π1's schemas of the
  ``--rl-sources`` documents only, so it has no other source to draw from.
- A mixed set already on disk is reused only when it records the same share, seed and chosen set; else
  :func:`check_reuse` refuses, naming both (the experiment), or the set is written again (the loop, whose
  phase inputs then name the difference of a finished phase).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.golden import sha256_file, source_of
from trainer.config_cli import cli_meta

if TYPE_CHECKING:
    import pyarrow as pa

OPTION = "--rl-mix-share"
MIX_SEED = 0
METADATA_KEY = b"train_mix"


class TrainMixError(ValueError):
    """A mix that cannot be built or reused; the message names ``--rl-mix-share`` and the reason."""


def rl_mix_share_field() -> Any:
    """The option, declared once for ``trainer experiment`` and ``trainer loop``."""
    return field(
        default=0.0,
        metadata=cli_meta(
            help="Share F (0 <= F < 1) of each GRPO phase's train prompts drawn from the sources its chosen set "
            "(--rl-sources, or an improvable set) lacks, spread evenly over them, seeded, so π2 keeps practising "
            "E2E/RotoWire; B1, B2, C1 only (C2's split has no other source). 0: the chosen set unchanged.",
            min=0.0,
        ),
    )


def check_share(share: float) -> None:
    if not 0.0 <= share < 1.0:
        raise TrainMixError(f"{OPTION}: {share}: the share must be at least 0 and below 1")


def check_restricted(share: float, restricted: bool, how: str) -> None:
    """A share needs a chosen subset of sources: the whole train split has no other source to draw from."""
    if share > 0 and not restricted:
        raise TrainMixError(f"{OPTION}: {share}: needs {how}; the whole train split has no other source to draw from")


def mixes(phase_built_from_golden: bool, share: float) -> bool:
    return share > 0 and phase_built_from_golden


def mixed_set_path(folder: Path, chosen: Path) -> Path:
    """Where the mix of ``chosen`` is written: ``folder/<chosen's name>+mix.parquet``."""
    return folder / f"{chosen.stem}+mix.parquet"


def even_quota(wanted: int, available: Mapping[str, int]) -> dict[str, int]:
    """``wanted`` spread evenly over the sources, the smallest first; one short of its part gives all it has."""
    quota: dict[str, int] = {}
    left = wanted
    order = sorted(available, key=lambda s: (available[s], s))
    for i, source in enumerate(order):
        part = -(-left // (len(order) - i))  # ceil
        quota[source] = min(available[source], part)
        left -= quota[source]
    return dict(sorted(quota.items()))


def build_mix(chosen: Path, train: Path, share: float, seed: int = MIX_SEED) -> tuple[pa.Table, dict[str, Any]]:
    """The mixed table of ``chosen`` (its rows, then the drawn rows of ``train``) and its record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.data.train_set import rl_row_ids

    check_share(share)
    kept, whole = pq.read_table(chosen), pq.read_table(train)
    chosen_sources = Counter(source_of(str(i or "")) for i in rl_row_ids(kept, chosen))
    train_sources = [source_of(str(i or "")) for i in rl_row_ids(whole, train)]
    rows: dict[str, list[int]] = {}
    for index, source in enumerate(train_sources):
        if source not in chosen_sources:
            rows.setdefault(source, []).append(index)
    if not rows:
        raise TrainMixError(
            f"{OPTION}: {share}: {chosen} already has every source of {train} ({sorted(chosen_sources)}): "
            "no other source to draw from"
        )
    n = kept.num_rows
    wanted = round(share * n / (1 - share))
    have = sum(len(r) for r in rows.values())
    if wanted > have:
        raise TrainMixError(
            f"{OPTION}: {share}: {n} chosen prompts need {wanted} from {sorted(rows)}, which have {have} in {train}; "
            "ask for a smaller share"
        )
    quota = even_quota(wanted, {s: len(r) for s, r in rows.items()})
    drawn = sorted(i for s, q in quota.items() for i in random.Random(f"{seed}:{s}").sample(rows[s], q))
    extra = whole.take(pa.array(drawn, type=pa.int64())).select(kept.schema.names).cast(kept.schema)
    record = {
        "share": share,
        "seed": seed,
        "chosen": {"path": str(chosen), "sha256": sha256_file(chosen), "prompts": dict(chosen_sources)},
        "drawn": {s: q for s, q in quota.items() if q},
        "prompts": dict(chosen_sources + Counter({s: q for s, q in quota.items() if q})),
        "total": n + len(drawn),
    }
    return pa.concat_tables([kept, extra]), record


def write_mixed_set(chosen: Path, train: Path, share: float, out: Path, seed: int = MIX_SEED) -> dict[str, Any]:
    """:func:`build_mix` written to ``out`` with its record in the file's metadata; the record and the path."""
    import pyarrow.parquet as pq

    table, record = build_mix(chosen, train, share, seed)
    meta = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(record).encode()}
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(meta), out)
    return record | {"path": str(out)}


def recorded_mix(path: Path) -> dict[str, Any] | None:
    """The record a mixed set was written with, or None (no file, or not a mixed set)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        return None
    raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else None


def check_reuse(out: Path, chosen: Path | None, share: float, seed: int = MIX_SEED) -> dict[str, Any] | None:
    """The record of the mixed set at ``out`` when it was built with this share, seed and chosen set (None when
    there is none); raises naming both when it was built otherwise (share 0: asked for no mix)."""
    was = recorded_mix(out)
    if was is None:
        return None
    now = {"share": share, "seed": seed, "chosen": str(chosen) if chosen else None}
    before = {"share": was["share"], "seed": was["seed"], "chosen": was["chosen"]["path"]}
    same_file = chosen is not None and chosen.is_file() and sha256_file(chosen) == was["chosen"]["sha256"]
    if before != now or not same_file:
        differ = "; ".join(f"{k}: built with {before[k]!r}, asked for {now[k]!r}" for k in now if before[k] != now[k])
        differ = differ or f"chosen set {chosen} changed since (SHA-256)"
        raise TrainMixError(f"{OPTION}: {out} was built otherwise ({differ}): remove it or use a new workdir")
    return was | {"path": str(out)}

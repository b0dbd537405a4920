"""A GRPO phase's prompt set must fill one training batch, checked before VERL starts Ray.

VERL's RL dataloader drops the last partial batch, so a train set smaller than ``data.train_batch_size``
gives an epoch of 0 steps and VERL 0.9.1 fails deep in ``fit`` with ``ZeroDivisionError`` after its
whole start-up (measured on a 4-GPU node: B2's 49 improvable prompts against a batch of 64, ~4 minutes of a
GPU for one line of traceback). This says which setting is short, by how much, before any of that.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from shared.golden import source_of

PROFILE_DIR = Path(__file__).resolve().parents[1] / "phases" / "configs" / "profile"  # launch.CONFIG_DIR / "profile"


def train_batch_size(profile: str, overrides: Sequence[str] = ()) -> int:
    """``data.train_batch_size`` of a GRPO run: the last override that sets it, else the profile's."""
    for item in reversed(overrides):
        if m := re.fullmatch(r"\+*data\.train_batch_size=(\d+)", item.strip()):
            return int(m.group(1))
    profile_yaml = yaml.safe_load((PROFILE_DIR / f"{profile}.yaml").read_text())
    return int(profile_yaml["data"]["train_batch_size"])


class TrainSetTooSmall(ValueError):
    """The prompts cannot fill one training batch."""


def files_of(train_files: Any) -> list[str]:
    """``data.train_files`` / ``data.val_files`` as a list (VERL takes one path or several)."""
    if isinstance(train_files, str):
        return [train_files]
    return [str(f) for f in train_files]


def count_prompts(train_files: str | Sequence[str]) -> int:
    """Rows over the parquet files (their metadata only; nothing is read)."""
    total = 0
    for f in files_of(train_files):
        if not Path(f).is_file():
            raise TrainSetTooSmall(f"data.train_files: {f} does not exist")
        total += pq.ParquetFile(f).metadata.num_rows
    return total


def check_fills_a_batch(train_files: str | Sequence[str], batch_size: int, max_samples: int | None) -> int:
    """The number of prompts VERL will use (``data.train_max_samples`` caps it where > 0); raises
    :class:`TrainSetTooSmall` naming the setting when it is below ``data.train_batch_size``."""
    n = count_prompts(train_files)
    used = min(n, max_samples) if max_samples is not None and max_samples > 0 else n
    if used < batch_size:
        raise TrainSetTooSmall(
            f"data.train_files ({', '.join(files_of(train_files))}) gives {used} prompts"
            + (f" (data.train_max_samples {max_samples})" if used < n else "")
            + f", fewer than data.train_batch_size {batch_size}: VERL drops a partial batch, so an epoch would"
            " have no step. Use more prompts (a larger preflight, or the whole train split) or a smaller"
            " data.train_batch_size."
        )
    return used



def rl_row_ids(table: pa.Table, path: Path) -> list[str | None]:
    """Each row's ``extra_info.id`` of an RL parquet's ``table`` read from ``path``; raises naming ``path``
    when it has no ``extra_info`` column."""
    if "extra_info" not in table.column_names:
        raise ValueError(f"{path}: no extra_info column (not an RL parquet of `trainer data build`)")
    return [(info or {}).get("id") for info in table.column("extra_info").to_pylist()]


def source_set_path(folder: Path, name: str, sources: Sequence[str]) -> Path:
    """Where ``--rl-sources`` writes ``name``'s train split of ``sources``: ``folder/<name>_<a+b>.parquet``."""
    return folder / f"{name}_{'+'.join(sources)}.parquet"


def source_prompt_set(train_parquet: Path, sources: Sequence[str], out: Path) -> int:
    """The rows of an RL parquet (``trainer data build`` / ``precompute-schemas``) whose ``extra_info.id`` is of
    one of ``sources`` (:func:`shared.golden.source_of`), written to ``out`` with the same Arrow schema, so
    ``data.train_files`` can point at it. Returns the rows kept; raises naming the source that has none."""
    table = pq.read_table(train_parquet)
    row_sources = [source_of(str(rid or "")) for rid in rl_row_ids(table, train_parquet)]
    missing = sorted(set(sources) - set(row_sources))
    if missing:
        raise ValueError(f"{train_parquet}: no prompt of source(s) {missing} (it has {sorted(set(row_sources))})")
    keep = [i for i, src in enumerate(row_sources) if src in sources]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(keep), out)
    return len(keep)


def write_source_set(train_parquet: Path, sources: Sequence[str], out: Path) -> dict[str, Any]:
    """:func:`source_prompt_set`, and what a manifest records of it (sources, prompts kept, path)."""
    n = source_prompt_set(train_parquet, sources, out)
    return {"sources": list(sources), "prompts": n, "path": str(out)}

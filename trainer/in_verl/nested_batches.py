"""Rows of VERL's packed (nested) batches selected, chunked and joined with one gather instead of a loop over samples.

Why: VERL 0.9.1 keeps a step's sequences as jagged nested tensors and splits them into mini and micro batches
with ``verl.utils.tensordict_utils.index_select_tensor_dict``, which unbinds every nested field into its samples,
indexes that tuple with each index (a 0-d tensor: one ``aten::item`` each) and packs the picked samples again.
A 64 x 16 B1 step selects 1,024 samples of ~17 nested fields twice (mini batches, then the length-balanced micro
batches): PyTorch's profiler counted 36,281 ``aten::item`` and 424 ``aten::unbind`` calls (0.63 s) in the
worker's update (bench/results/rl_step_trace.md). ``restore_dynamic_batch`` (the micro batches' outputs put back
in order), ``chunk_tensordict`` and ``concat_nested_tensors`` do the same per sample.

What: a jagged nested tensor is its packed ``values`` and ``offsets``; :func:`select_rows` reads the offsets once
and gathers the picked samples' token positions in one index, :func:`concat_rows` joins packed values and shifts
offsets. The results equal VERL's (values, offsets, dtypes, devices, the other fields and non-tensor data;
tested against VERL's functions). A nested field these cannot take (ragged on another dimension, or with holes
between samples) goes through VERL's own function unchanged.

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES``; VERL's modules are
patched when they are imported (``trainer/in_verl/import_hook.py``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from trainer.in_verl.import_hook import original, patch_on_import, rebind, replace

__all__ = [
    "BALANCING_MODULE",
    "MODULE",
    "TENSORDICT_MODULE",
    "concat_rows",
    "index_tensor",
    "install",
    "packed",
    "select_rows",
    "split_rows",
]

MODULE = "trainer.in_verl.nested_batches"
TENSORDICT_MODULE = "verl.utils.tensordict_utils"
BALANCING_MODULE = "verl.utils.seqlen_balancing"
# Modules that bind ``restore_dynamic_batch`` by name when they are imported.
_BINDS_RESTORE = ("verl.workers.engine.utils", "verl.workers.engine.megatron.transformer_impl")

_log = logging.getLogger(__name__)


def packed(tensor: Any) -> bool:
    """Whether ``tensor`` is a jagged nested tensor that :func:`select_rows` takes: ragged on the first dimension
    after the batch, its samples back to back in ``values`` (no holes)."""
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.is_nested
        and tensor.layout == torch.jagged
        and getattr(tensor, "_ragged_idx", 1) == 1
        and tensor.lengths() is None  # type: ignore[attr-defined]
    )


def index_tensor(indices: torch.Tensor | Sequence[Any]) -> torch.Tensor:
    """``indices`` as a 1-D int64 CPU tensor; a list of 0-d tensors (VERL's data loader yields those) is stacked
    rather than read one element at a time."""
    if isinstance(indices, torch.Tensor):
        out = indices
    elif len(indices) > 0 and all(isinstance(i, torch.Tensor) for i in indices):
        out = torch.stack(list(indices))
    else:
        out = torch.as_tensor(list(indices), dtype=torch.long)
    out = out.to(device="cpu", dtype=torch.long)
    if out.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(out.shape)}")
    return out


def _jagged(values: torch.Tensor, offsets_cpu: torch.Tensor) -> torch.Tensor:
    lengths = offsets_cpu.diff()
    return torch.nested.nested_tensor_from_jagged(
        values,
        offsets_cpu.to(values.device, non_blocking=True),
        min_seqlen=int(lengths.min()) if len(lengths) else 0,
        max_seqlen=int(lengths.max()) if len(lengths) else 0,
    )


def select_rows(tensor: torch.Tensor, indices: torch.Tensor | Sequence[Any]) -> torch.Tensor:
    """Samples ``indices`` of the packed nested ``tensor``, in that order (repeats allowed), as a new packed nested
    tensor: its offsets are read once, its values gathered in one index."""
    if not packed(tensor):
        raise ValueError("select_rows: a jagged nested tensor ragged on dim 1 with no holes is needed")
    idx = index_tensor(indices)
    if len(idx) == 0:
        raise ValueError("select_rows: no indices")
    offsets = tensor.offsets().to("cpu")  # type: ignore[attr-defined]
    n = len(offsets) - 1
    if int(idx.min()) < -n or int(idx.max()) >= n:
        raise IndexError(f"select_rows: an index outside the {n} samples (min {int(idx.min())}, max {int(idx.max())})")
    idx = idx.remainder(n)
    starts, lengths = offsets[idx], offsets[idx + 1] - offsets[idx]
    new_offsets = torch.zeros(len(idx) + 1, dtype=offsets.dtype)
    torch.cumsum(lengths, dim=0, out=new_offsets[1:])
    total = int(new_offsets[-1])
    values = tensor.values()
    device = values.device
    shift = (starts - new_offsets[:-1]).to(device, non_blocking=True)
    positions = torch.arange(total, device=device) + torch.repeat_interleave(
        shift, lengths.to(device, non_blocking=True), output_size=total
    )
    return _jagged(values[positions], new_offsets)


def split_rows(tensor: torch.Tensor, chunks: int) -> list[torch.Tensor]:
    """The packed nested ``tensor`` cut into ``chunks`` runs of equal sample counts, each a packed nested tensor
    of its own values: the offsets are read once for all of them."""
    if not packed(tensor):
        raise ValueError("split_rows: a jagged nested tensor ragged on dim 1 with no holes is needed")
    offsets = tensor.offsets().to("cpu")  # type: ignore[attr-defined]
    n = len(offsets) - 1
    if chunks < 1 or n % chunks:
        raise ValueError(f"split_rows: {n} samples do not split into {chunks} equal chunks")
    size, values = n // chunks, tensor.values()
    out = []
    for i in range(chunks):
        part = offsets[i * size : (i + 1) * size + 1]
        lo, hi = int(part[0]), int(part[-1])
        out.append(_jagged(values[lo:hi].clone(), part - lo))
    return out


def concat_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The packed nested ``tensors`` one after another along the batch, as one packed nested tensor."""
    if not tensors or not all(packed(t) for t in tensors):
        raise ValueError("concat_rows: packed jagged nested tensors are needed")
    offsets = [t.offsets().to("cpu") for t in tensors]  # type: ignore[attr-defined]
    joined, end = [offsets[0]], offsets[0][-1]
    for o in offsets[1:]:
        joined.append(o[1:] + end)
        end = end + o[-1]
    return _jagged(torch.cat([t.values() for t in tensors]), torch.cat(joined))


def _fast_keys(batch: Any) -> list[str]:
    return [k for k, v in batch.items() if packed(v)]


def _index_select(batch: Any, indices: Any) -> Any:
    """VERL's ``index_select_tensor_dict`` with its packed nested fields gathered by :func:`select_rows`."""
    if batch is None:
        return None
    verls = original(sys.modules[TENSORDICT_MODULE], "index_select_tensor_dict")
    idx = index_tensor(indices)
    fast = _fast_keys(batch)
    if not fast or len(idx) == 0:
        return verls(batch, idx)
    out = verls(batch.exclude(*fast), idx)
    for key in fast:
        out[key] = select_rows(batch[key], idx)
    return out


def _chunk(td: Any, chunks: int) -> list[Any]:
    """VERL's ``chunk_tensordict`` with its packed nested fields cut by their offsets."""
    verls = original(sys.modules[TENSORDICT_MODULE], "chunk_tensordict")
    fast = _fast_keys(td) if chunks > 0 and len(td) % chunks == 0 else []
    if not fast:
        return verls(td, chunks)  # type: ignore[no-any-return]
    parts = verls(td.exclude(*fast), chunks)
    for key in fast:
        for part, rows in zip(parts, split_rows(td[key], chunks), strict=True):
            part[key] = rows
    return parts  # type: ignore[no-any-return]


def _concat_nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    """VERL's ``concat_nested_tensors``, by offsets when every tensor is packed."""
    if tensors and all(packed(t) for t in tensors):
        return concat_rows(tensors)
    return original(sys.modules[TENSORDICT_MODULE], "concat_nested_tensors")(tensors)  # type: ignore[no-any-return]


def _restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """VERL's ``restore_dynamic_batch``: a nested output of the length-balanced micro batches back in the
    mini batch's order, by one gather."""
    if not packed(data):
        restore = original(sys.modules[BALANCING_MODULE], "restore_dynamic_batch")
        return restore(data, batch_idx_list)  # type: ignore[no-any-return]
    order = torch.tensor([i for part in batch_idx_list for i in part], dtype=torch.long)
    if len(order) != data.shape[0]:
        raise ValueError(f"restore_dynamic_batch: {len(order)} indices for a batch of {data.shape[0]}")
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    return select_rows(data, inverse)


def _patch(module: ModuleType, replacements: dict[str, Callable[..., Any]]) -> None:
    replace(module, replacements)
    _log.info("%s: %s of %s by offsets", MODULE, ", ".join(replacements), module.__name__)


def patch_tensordict_utils(module: ModuleType) -> None:
    """Point VERL's tensordict helpers at the gathers above (idempotent)."""
    _patch(
        module,
        {
            "index_select_tensor_dict": _index_select,
            "chunk_tensordict": _chunk,
            "concat_nested_tensors": _concat_nested,
        },
    )


def patch_seqlen_balancing(module: ModuleType) -> None:
    """Point ``restore_dynamic_batch`` at the gather above, in its module and where it is already bound."""
    _patch(module, {"restore_dynamic_batch": _restore_dynamic_batch})
    rebind(_BINDS_RESTORE, "restore_dynamic_batch", _restore_dynamic_batch)


def install() -> None:
    """Patch VERL's modules now if they are imported, else when they are (idempotent)."""
    patch_on_import(TENSORDICT_MODULE, patch_tensordict_utils, "index_select_tensor_dict")
    patch_on_import(BALANCING_MODULE, patch_seqlen_balancing, "restore_dynamic_batch")


install()

"""Attention over padding-free (packed) micro batches without flash-attn: ``attn_implementation=packed_sdpa``.

Why: VERL's FSDP engine removes padding (``model.use_remove_padding=true``) by concatenating a micro batch's
sequences into one row, ``(1, total_tokens)``, with position ids that restart at 0 for each sequence, and
relies on flash-attn's variable-length kernel to keep the sequences apart. There is no flash-attn wheel for
torch 2.11 + CUDA 13 (our GPU nodes). With ``sdpa``, transformers turns the packed row into a dense
block-diagonal mask of ``total_tokens``² entries, so packing cost more than it saved and the gpu profiles
train on padded micro batches instead: each padded to its longest sample, about 2.5 times the real tokens
of a GRPO step (prompts of 100–500 tokens, answers of 20–120).

What: an attention function registered with transformers under :data:`NAME`. On a packed row it finds the
sequence starts from the position ids (once per forward, not once per layer) and calls PyTorch's own
variable-length flash kernel (``torch.nn.attention.varlen.varlen_attn``, CUDA, bf16/fp16, or fp32 under
autocast to either); where that kernel is absent (CPU, fp32 without autocast) it runs causal
``scaled_dot_product_attention`` per sequence: the same numbers, slower.
A padded batch (a 2D attention mask; transformers hands it over as flash-attn's mask rule does) is masked
per key and causally, so the model stays correct outside VERL's packed path. The values equal ``sdpa`` on the
same sequences up to float rounding (tests/trainer/in_verl/test_packed_attention.py).

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES`` (``import verl``
imports it in every VERL process), and a profile selects it with
``actor_rollout_ref.model.override_config.attn_implementation=packed_sdpa`` (RL) or
``model.override_config.attn_implementation=packed_sdpa`` (SFT), beside ``use_remove_padding=true``.
An exported checkpoint's ``config.json`` does not name it (:func:`install` keeps transformers' rule that
only a loaded model carries its attention implementation).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

__all__ = ["MODULE", "NAME", "install", "packed_sdpa_forward", "sequence_bounds"]

MODULE = "trainer.in_verl.packed_attention"
NAME = "packed_sdpa"

_log = logging.getLogger(__name__)
# The bounds of the last packed row seen: every layer of one forward passes the same position-id tensor object
# (held by a weak reference, so a later tensor at the same address never matches).
_bounds_cache: dict[str, Any] = {"ref": None, "value": None}


def _varlen_kernel() -> Any | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


_VARLEN = _varlen_kernel()
# PyTorch 2.10/2.11 take is_causal=...; later releases take window_size=(-1, 0) for causal attention.
_VARLEN_PARAMS = set(inspect.signature(_VARLEN).parameters) if _VARLEN is not None else set()


def sequence_bounds(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens int32 (n+1,), longest)`` of a packed row whose position ids restart at their minimum."""
    ref = _bounds_cache["ref"]
    if ref is not None and ref() is position_ids and _bounds_cache["version"] == position_ids._version:
        return _bounds_cache["value"]  # type: ignore[no-any-return]
    flat = position_ids.reshape(-1)
    starts = (flat == flat.min()).nonzero().view(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)])
    longest = int(cu.diff().max().item())
    _bounds_cache.update(ref=weakref.ref(position_ids), version=position_ids._version, value=(cu, longest))
    return cu, longest


def _per_sequence(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """Causal sdpa on each sequence of a packed row ``(1, h, t, d)``; returns ``(1, t, h, d)``."""
    bounds = cu.tolist()
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scaling
        )
        for s, e in itertools.pairwise(bounds)
        if e > s
    ]
    return torch.cat(outs, dim=2).transpose(1, 2)


def _varlen(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: torch.Tensor, longest: int, scaling: float | None
) -> torch.Tensor:
    """PyTorch's variable-length flash kernel on a packed row ``(1, h, t, d)``; returns ``(1, t, h, d)``."""
    assert _VARLEN is not None
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (t, h, d)
    kwargs: dict[str, Any] = {"scale": scaling}
    if "is_causal" in _VARLEN_PARAMS:
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    out: torch.Tensor = _VARLEN(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, longest, longest, **kwargs)
    return out.unsqueeze(0)


def _masked_padded(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """A padded batch ``(b, h, t, d)`` with a 2D key mask ``(b, kv)``: causal and key-masked sdpa."""
    t, kv = query.shape[2], key.shape[2]
    causal = torch.ones(t, kv, dtype=torch.bool, device=query.device).tril(kv - t)
    mask = causal[None, None] & keep[:, None, None, -kv:].to(torch.bool)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return torch.nan_to_num(out).transpose(1, 2)  # a fully padded query row has no key: 0, as flash-attn gives


_HALF = (torch.float16, torch.bfloat16)


def varlen_dtype(query: torch.Tensor) -> torch.dtype | None:
    """The dtype the varlen kernel runs in for ``query``, None where it cannot run: a half dtype as given, or
    fp32 under CUDA autocast to a half dtype (rotary embeddings in fp32 give an fp32 query there), which is cast
    to autocast's dtype as ``scaled_dot_product_attention`` itself is under autocast."""
    if _VARLEN is None or not query.is_cuda:
        return None
    if query.dtype in _HALF:
        return query.dtype
    if query.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        return dtype if dtype in _HALF else None
    return None


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query (b, h, t, d)``, ``key``/``value (b, kv_heads, t, d)``;
    returns ``((b, t, h, d), None)``."""
    if dropout:
        raise ValueError(f"{NAME}: attention dropout {dropout} is not supported (training uses 0)")
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)  # grouped-query attention: transformers' own
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"{NAME}: expected a 2D padding mask, got shape {tuple(attention_mask.shape)}")
        return _masked_padded(query, key, value, attention_mask, scaling), None
    position_ids = kwargs.get("position_ids")
    if query.shape[0] == 1 and position_ids is not None and query.shape[2] == position_ids.shape[-1]:
        cu, longest = sequence_bounds(position_ids)
        if cu.numel() > 2:
            dtype = varlen_dtype(query)
            if dtype is not None:
                return _varlen(query.to(dtype), key.to(dtype), value.to(dtype), cu, longest, scaling), None
            return _per_sequence(query, key, value, cu, scaling), None
    out = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[2] > 1, scale=scaling)
    return out.transpose(1, 2), None


def install() -> None:
    """Register :data:`NAME` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, packed_sdpa_forward)
    # flash-attn's mask rule: None when nothing is padded (a packed row), else the 2D padding mask
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    _log.debug("%s: attention %r registered (varlen kernel: %s)", MODULE, NAME, _VARLEN is not None)


install()

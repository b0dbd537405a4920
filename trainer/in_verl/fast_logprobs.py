"""Block-vectorised token log-probabilities for VERL 0.9.1 where flash-attn's cross-entropy is absent.

Why: VERL computes the log-probability of each label token with flash-attn's Triton cross-entropy
when ``flash_attn`` is installed, and otherwise with ``logprobs_from_logits_v2``, which loops in
Python over the first dimension of the logits "to reduce peak memory". The FSDP engine passes the
logits unpadded, as ``(tokens, vocab)``, so that loop runs one ``log_softmax`` + ``gather`` per
token, forward and backward. There is no flash-attn wheel for torch 2.11 + CUDA 13 (our GPU nodes),
and on a 4 x H200 node our A1 SFT ran at about 1.5 s per step of 32 examples (~8.7k tokens, VERL's
MFU 0.006), against 0.16 s per step for a plain Hugging Face loop on one H100. On CPU the loop is
hidden by the matmuls, which is why CPU runs never showed it.

What: :func:`logprobs_by_row_blocks` is the same computation over blocks of rows (at most
:data:`BLOCK_ELEMENTS` logits per block), with VERL's dtype rule kept: fp32/fp64 take
``x[label] - logsumexp(x)``, other dtypes (bf16) ``log_softmax(x)[label]``. Rows are independent,
so the values and gradients equal VERL's up to float rounding (tested against VERL's own function),
and memory without autograd is bounded by one block. With autograd, VERL's loop keeps every row's
``log_softmax`` for the backward pass as well, so the peak is the same.

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES`` for every
profile, and ``import verl`` imports it in each process that imports VERL (the driver, torchrun
ranks, Ray workers). :func:`install` replaces ``verl.utils.torch_functional.logprobs_from_logits_v2``;
``logprobs_from_logits`` looks that name up at call time, so callers that imported
``logprobs_from_logits`` earlier get the new path too.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from trainer.in_verl import import_hook

__all__ = ["BLOCK_ELEMENTS", "MODULE", "install", "installed", "logprobs_by_row_blocks"]

MODULE = "trainer.in_verl.fast_logprobs"
# Logits per block: 2^27 elements are 256 MiB in bf16 (2,730 rows of a 49,152-token vocabulary).
BLOCK_ELEMENTS = 1 << 27

_log = logging.getLogger(__name__)


def logprobs_by_row_blocks(
    logits: torch.Tensor, labels: torch.Tensor, block_elements: int = BLOCK_ELEMENTS
) -> torch.Tensor:
    """``log p(label)`` for logits ``(..., vocab)`` and labels ``(...)``; VERL's v2 semantics."""
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be logits shape without vocab {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1)
    rows = flat_logits.shape[0]
    block = max(1, math.floor(block_elements / max(vocab, 1)))
    parts: list[torch.Tensor] = []
    for start in range(0, rows, block):
        chunk = flat_logits[start : start + block]
        index = flat_labels[start : start + block].unsqueeze(-1)
        if chunk.dtype in (torch.float32, torch.float64):
            parts.append(chunk.gather(-1, index).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
        else:
            parts.append(F.log_softmax(chunk, dim=-1).gather(-1, index).squeeze(-1))
    if not parts:
        return flat_logits.new_empty(labels.shape)
    return torch.cat(parts).reshape(labels.shape)


def installed() -> bool:
    import verl.utils.torch_functional as tf

    return tf.logprobs_from_logits_v2 is logprobs_by_row_blocks


def install() -> None:
    """Replace VERL's row loop (idempotent); the original stays reachable for tests."""
    import verl.utils.torch_functional as tf

    if installed():
        return
    import_hook.replace(tf, {"logprobs_from_logits_v2": logprobs_by_row_blocks})
    _log.info("%s: verl logprobs_from_logits_v2 replaced by the row-block version", MODULE)


def original() -> object:
    """VERL's own ``logprobs_from_logits_v2`` (after :func:`install`)."""
    import verl.utils.torch_functional as tf

    return import_hook.original(tf, "logprobs_from_logits_v2")


install()

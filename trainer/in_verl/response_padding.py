"""The update loss's response slicing in one gather instead of a loop over samples (VERL 0.9.1).

Why: VERL's PPO loss (``verl.workers.utils.losses.ppo_loss``) turns the packed log-probs and entropy of a micro
batch into padded ``(samples, response length)`` tensors with ``no_padding_2_padding``, which slices the packed
values once per sample with offsets held in tensors and pads each slice. On a GPU every such slice reads its bounds
back from the device (772 ``aten::item`` calls a micro batch of 128 samples, bench/results/response_padding.md) and
the backward pass adds one full-length gradient per slice. PyTorch's profiler put B1's update at a GPU busy share of
33%, with 36,281 ``aten::item`` calls in all (bench/results/rl_step_trace.md); this loop is part of them.

What: :func:`responses_padded` computes the same tensor with one index and one gather: sample ``i``'s position
``j`` is the packed value at ``end_i - response_len_i - 1 + j`` (the model's output for the token before it), and 0
past the sample's response, as ``F.pad`` gives; a response longer than the padded length is cut, as a negative pad
cuts it. Values and gradients equal VERL's (tested against VERL's own function). VERL's checks stay: the packed
length must equal the sum of the sequence lengths and no prompt may be empty.

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES``; the loss module is
patched when it is imported (``trainer/in_verl/import_hook.py``), in the worker that trains.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import torch

from trainer.in_verl.import_hook import patch_on_import

__all__ = ["LOSSES_MODULE", "MODULE", "install", "patch", "responses_padded"]

MODULE = "trainer.in_verl.response_padding"
LOSSES_MODULE = "verl.workers.utils.losses"

_log = logging.getLogger(__name__)


def _lengths(data: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(prompt lengths, response lengths, padded response length) of a micro batch, as VERL reads them."""
    from verl.utils import tensordict_utils as tu

    prompt_ids, response_ids = data["prompts"], data["responses"]
    max_len = tu.get_non_tensor_data(data=data, key="max_response_len", default=-1)
    if prompt_ids.is_nested:
        prompt_lens, response_lens = prompt_ids.offsets().diff(), response_ids.offsets().diff()
        if max_len < 0:
            max_len = int(response_lens.max().item())
    else:
        mask = data["attention_mask"]
        if mask.is_nested:
            raise ValueError("responses_padded: a padded batch needs a padded attention_mask")
        prompt_lens = mask[:, : prompt_ids.shape[1]].sum(dim=1)
        response_lens = mask[:, prompt_ids.shape[1] :].sum(dim=1)
        max_len = response_ids.shape[1]
    return prompt_lens, response_lens, int(max_len)


def responses_padded(tensor: torch.Tensor, data: Any) -> torch.Tensor:
    """VERL's ``no_padding_2_padding``: the packed ``(tokens, *)`` (or nested) output's response part as
    ``(samples, max_response_len, *)``, left-shifted by one token, zero-padded."""
    values = tensor.values() if tensor.is_nested else tensor
    prompt_lens, response_lens, max_len = _lengths(data)
    prompt_lens, response_lens = prompt_lens.to(values.device), response_lens.to(values.device)
    ends = (prompt_lens + response_lens).cumsum(dim=0)
    total = int(ends[-1].item())
    if total != values.shape[0]:
        raise ValueError(f"responses_padded: the sequences hold {total} tokens, the packed output {values.shape[0]}")
    if bool(prompt_lens.eq(0).any()):
        lengths = prompt_lens.tolist()
        raise ValueError(f"responses_padded: an empty prompt (lengths {lengths}); a response starts after it")
    j = torch.arange(max_len, device=values.device)
    valid = j.unsqueeze(0) < response_lens.unsqueeze(1)  # (samples, max_len)
    index = torch.where(valid, (ends - response_lens - 1).unsqueeze(1) + j.unsqueeze(0), 0)
    gathered = values[index]  # (samples, max_len, *)
    keep = valid.reshape(*valid.shape, *([1] * (values.dim() - 1)))
    return torch.where(keep, gathered, torch.zeros((), dtype=values.dtype, device=values.device))


def patch(module: ModuleType) -> None:
    """Point the loss module's ``no_padding_2_padding`` at :func:`responses_padded` (idempotent)."""
    if getattr(module, "no_padding_2_padding", None) is responses_padded:
        return
    setattr(module, "no_padding_2_padding", responses_padded)  # noqa: B010
    _log.info("%s: VERL's loss slices responses in one gather", MODULE)


def install() -> None:
    """Patch VERL's loss module now if it is imported, else when it is (idempotent)."""
    patch_on_import(LOSSES_MODULE, patch, "ppo_loss")


install()

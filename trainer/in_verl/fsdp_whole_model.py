"""FSDP2 around the policy as one unit, when the actor's ``fsdp_config.wrap_policy.whole_model`` is true (VERL 0.9.1).

Why: VERL's ``apply_fsdp2`` shards every decoder layer (and untied embeddings) as a unit of its own, then the root.
On one GPU a unit shards nothing, yet each one runs its hooks around every forward and backward: PyTorch's profiler
put them at ~0.8 s of host time in B1's 5.2 s worker update at 64 x 16 on one H200 (30 layers x 8 micro batches;
bench/results/rl_step_batches.md). VERL's wrap policy cannot name the root alone: a class that matches nothing is
refused, and wrapping the decoder (``LlamaModel``) splits SmolLM2's tied embedding from its head.

What: with ``+actor_rollout_ref.actor.fsdp_config.wrap_policy.whole_model=true`` the model is sharded once, at its
root, with VERL's own arguments (mesh, mixed precision, offload, reshard policy); otherwise VERL's function runs
unchanged. The parameters and the optimisation are the same (tested: gradients equal to the per-layer wrap's). Over
several GPUs one unit means one all-gather of the whole model and no overlap with compute: meant for one GPU.

How it is loaded: the phase launcher lists this module in ``VERL_USE_EXTERNAL_MODULES``; VERL's ``fsdp_utils`` is
patched when it is imported (``trainer/in_verl/import_hook.py``), before its FSDP engine binds ``apply_fsdp2``.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

from trainer.in_verl.import_hook import original, patch_on_import, rebind, replace

__all__ = ["FSDP_UTILS_MODULE", "KEY", "MODULE", "install", "whole_model_wanted"]

MODULE = "trainer.in_verl.fsdp_whole_model"
FSDP_UTILS_MODULE = "verl.utils.fsdp_utils"
KEY = "whole_model"  # under the actor's fsdp_config.wrap_policy
_BINDS = ("verl.workers.engine.fsdp.transformer_impl",)  # modules that bind apply_fsdp2 by name

_log = logging.getLogger(__name__)


def whole_model_wanted(config: Any) -> bool:
    """Whether an FSDP engine config (VERL's dataclass or a mapping) asks for one unit."""
    policy = config.get("wrap_policy", None) if hasattr(config, "get") else getattr(config, "wrap_policy", None)
    if not policy:
        return False
    value = policy.get(KEY, False) if hasattr(policy, "get") else False
    if not isinstance(value, bool):
        raise ValueError(f"fsdp_config.wrap_policy.{KEY} must be true or false, got {value!r}")
    return value


def _apply_fsdp2(model: Any, fsdp_kwargs: dict[str, Any], config: Any) -> None:
    if not whole_model_wanted(config):
        original(sys.modules[FSDP_UTILS_MODULE], "apply_fsdp2")(model, fsdp_kwargs, config)
        return
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, **fsdp_kwargs)
    _log.info("%s: FSDP2 around %s as one unit", MODULE, type(model).__name__)


def patch(module: ModuleType) -> None:
    """Point ``apply_fsdp2`` at the one-unit choice (idempotent), where it is defined and where it is bound."""
    replace(module, {"apply_fsdp2": _apply_fsdp2})
    rebind(_BINDS, "apply_fsdp2", _apply_fsdp2)


def install() -> None:
    """Patch VERL's ``fsdp_utils`` now if it is imported, else when it is (idempotent)."""
    patch_on_import(FSDP_UTILS_MODULE, patch, "apply_fsdp2")


install()

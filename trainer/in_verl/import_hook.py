"""Patch a module of VERL once it is imported, without importing it in every process that imports VERL.

The rules of ``trainer/in_verl/`` load through ``VERL_USE_EXTERNAL_MODULES`` in every VERL process (the driver, Ray's
workers, vLLM's processes); importing the module they patch there would cost each of them its import. A finder on
``sys.meta_path`` lets the module's own loader run and calls the patch right after.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` with the other finders and wraps its loader so that ``patch`` runs once it has executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _PatchAfterImport) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader, self.patch)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


def patch_on_import(name: str, patch: Callable[[ModuleType], None], ready_attr: str) -> None:
    """Patch module ``name`` now if it is imported (it has ``ready_attr``), else when it is (idempotent)."""
    loaded = sys.modules.get(name)
    if loaded is not None and hasattr(loaded, ready_attr):
        patch(loaded)
        return
    if not any(isinstance(f, _PatchAfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))


def rebind(modules: Sequence[str], attr: str, value: Any) -> None:
    """Set ``attr`` to ``value`` in those of ``modules`` already imported that bound it by name
    (``from X import attr``): a patch of ``X`` after their import would not reach them."""
    for name in modules:
        bound = sys.modules.get(name)
        if bound is not None and hasattr(bound, attr):
            setattr(bound, attr, value)


_ORIGINALS = "_trainer_originals"  # on a patched module: name -> VERL's own function


def replace(module: ModuleType, replacements: dict[str, Any]) -> None:
    """Set each name of ``replacements`` in ``module``, keeping VERL's own value for :func:`original`; a name
    already replaced keeps its first original (idempotent)."""
    originals: dict[str, Any] = module.__dict__.setdefault(_ORIGINALS, {})
    for name, value in replacements.items():
        originals.setdefault(name, getattr(module, name))
        setattr(module, name, value)


def original(module: ModuleType, name: str) -> Any:
    """VERL's own ``module.name``: the value :func:`replace` kept, else the module's current one."""
    return module.__dict__.get(_ORIGINALS, {}).get(name, getattr(module, name))

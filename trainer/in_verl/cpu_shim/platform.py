"""A ``cpu`` VERL platform: gloo, no IPC, a stub device module, device id ``"cpu"``."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

PLATFORM_NAME = "cpu"


class CpuDeviceId(str):
    """Device id ``"cpu"`` that formats as ``0``.

    VERL both calls ``tensor.to(get_device_id())`` (needs ``"cpu"``) and builds
    ``f"{get_device_name()}:{get_device_id()}"`` (needs ``cpu:0``); one value serves both.
    """

    def __new__(cls) -> CpuDeviceId:
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)

    def __index__(self) -> int:
        return 0


DEVICE_ID = CpuDeviceId()


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _device_module() -> types.ModuleType:
    """What VERL calls on ``get_torch_device()``; memory queries answer from host RAM or 0."""
    mod = types.ModuleType("trainer.in_verl.cpu_shim.device")
    funcs: dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: DEVICE_ID,
        "set_device": _noop,
        "synchronize": _noop,
        "empty_cache": _noop,
        "ipc_collect": _noop,
        "set_per_process_memory_fraction": _noop,
        "reset_peak_memory_stats": _noop,
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "get_rng_state": lambda *_a, **_k: torch.get_rng_state(),
        "set_rng_state": lambda state, *_a, **_k: torch.set_rng_state(state),
        "mem_get_info": _mem_get_info,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "get_device_name": lambda *_a, **_k: "cpu",
        "current_stream": torch.cpu.current_stream,
        "stream": torch.cpu.stream,
        "Stream": torch.cpu.Stream,
        "Event": torch.cpu.Event,
    }
    for name, fn in funcs.items():
        setattr(mod, name, fn)
    return mod


DEVICE_MODULE = _device_module()


class PlatformCPU(PlatformBase):
    """VERL platform for CPU-only hosts (toy-scale GRPO/SFT in development and CI)."""

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only an explicit VERL_PLATFORM=cpu selects it.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> Any:
        return DEVICE_ID

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # One fake "GPU" resource (ray init num_gpus=1) lets VERL place its worker groups.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None

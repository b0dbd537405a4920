"""The GPU executor's command line and environment (no GPU needed: pure functions of the settings)."""

from __future__ import annotations

import pytest

from services.executor_vllm.cpu_launcher import CpuExecutor
from services.executor_vllm.gpu_launcher import SAFE_GPU_ENV, GpuExecutor, gpu_env
from services.executor_vllm.vllm_server import VllmExecutor


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_command_pins_dtype_memory_share_and_tensor_parallel_to_its_gpus() -> None:
    ex = GpuExecutor("/models/pi2", gpus=[2, 3], served_model_name="pi2", port=18123, gpu_memory_utilization=0.3)
    cmd = ex.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--model") == "/models/pi2" and _flag(cmd, "--served-model-name") == "pi2"
    assert _flag(cmd, "--host") == "127.0.0.1" and _flag(cmd, "--port") == "18123"
    assert _flag(cmd, "--dtype") == "bfloat16"
    assert _flag(cmd, "--gpu-memory-utilization") == "0.3"
    assert _flag(cmd, "--tensor-parallel-size") == "2"
    assert "--enforce-eager" not in cmd  # CUDA graphs on GPU
    assert "--enable-prefix-caching" in cmd and "--no-enable-prefix-caching" not in cmd
    assert ex.url == "http://127.0.0.1:18123"


def test_prefix_caching_and_eager_are_switches() -> None:
    cmd = GpuExecutor("/m", gpus=["0"], port=1, enforce_eager=True, prefix_caching=False).command()
    assert "--no-enable-prefix-caching" in cmd and "--enable-prefix-caching" not in cmd
    assert cmd.count("--enforce-eager") == 1


def test_graphs_without_compile_capture_decode_graphs_in_compilation_mode_none() -> None:
    import json

    cmd = GpuExecutor("/m", gpus=["0"], port=1, compile_graphs=False).command()
    assert "--enforce-eager" not in cmd
    assert json.loads(_flag(cmd, "--compilation-config")) == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "--compilation-config" not in GpuExecutor("/m", gpus=["0"], port=1).command()  # compiled: vLLM's default
    eager = GpuExecutor("/m", gpus=["0"], port=1, enforce_eager=True, compile_graphs=False).command()
    assert "--enforce-eager" in eager and "--compilation-config" not in eager  # eager wins: no graphs at all


def test_env_sets_the_gpus_and_keeps_multicast_off_whatever_the_caller_set() -> None:
    env = gpu_env(["1"], {"NCCL_NVLS_ENABLE": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert {k: env[k] for k in SAFE_GPU_ENV} == SAFE_GPU_ENV
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"] == "/bin"
    assert GpuExecutor("/m", gpus=["5"]).env()["CUDA_VISIBLE_DEVICES"] == "5"


@pytest.mark.parametrize(
    ("gpus", "mem", "match"),
    [([], 0.5, "gpus"), (["0", "0"], 0.5, "distinct"), (["0"], 0.0, "gpu_memory_utilization"), (["0"], 1.5, "gpu_")],
)
def test_bad_settings_name_the_field(gpus: list[str], mem: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GpuExecutor("/m", gpus=gpus, gpu_memory_utilization=mem)


def test_cpu_and_gpu_share_the_server_entrypoint() -> None:
    cpu, gpu = CpuExecutor("/m", port=1).command(), GpuExecutor("/m", gpus=[0], port=1).command()
    assert cpu[:9] == gpu[:9]
    assert _flag(cpu, "--dtype") == "float32" and "--enforce-eager" in cpu


def test_cpu_and_gpu_are_two_builds_of_one_server() -> None:
    """Both builds share the process handling of :class:`VllmExecutor`; neither is a kind of the other."""
    assert issubclass(CpuExecutor, VllmExecutor) and issubclass(GpuExecutor, VllmExecutor)
    assert not issubclass(GpuExecutor, CpuExecutor) and not issubclass(CpuExecutor, GpuExecutor)
    with pytest.raises(TypeError):
        VllmExecutor("/m", port=1)  # type: ignore[abstract]

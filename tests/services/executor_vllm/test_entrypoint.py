"""The executor entrypoint's environment → vLLM flags mapping (pure; no server is started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.executor_vllm.entrypoint import LaunchConfigError, serve_command, serve_env

REPO = Path(__file__).resolve().parents[3]


def flag(cmd: list[str], name: str) -> str:
    """The value after ``name`` (fails the test if the flag is absent or repeated)."""
    assert cmd.count(name) == 1, f"{name} occurs {cmd.count(name)} times in {cmd}"
    return cmd[cmd.index(name) + 1]


def test_gpu_defaults() -> None:
    cmd = serve_command({})
    assert cmd[:3] == ["vllm", "serve", "/models/executor"]
    assert flag(cmd, "--served-model-name") == "executor"
    assert flag(cmd, "--host") == "127.0.0.1"
    assert flag(cmd, "--port") == "8001"
    assert flag(cmd, "--dtype") == "auto"
    assert flag(cmd, "--seed") == "0"
    assert flag(cmd, "--tensor-parallel-size") == "1"
    assert "--enable-prefix-caching" in cmd and "--no-enable-prefix-caching" not in cmd
    for absent in ("--max-model-len", "--gpu-memory-utilization", "--chat-template", "--enforce-eager", "--api-key"):
        assert absent not in cmd


def test_gpu_full_mapping() -> None:
    env = {
        "EXECUTOR_MODEL_PATH": "/models/pi2",
        "EXECUTOR_SERVED_MODEL_NAME": "pi2-local",
        "EXECUTOR_DTYPE": "bfloat16",
        "EXECUTOR_MAX_MODEL_LEN": "8192",
        "EXECUTOR_GPU_MEMORY_UTILIZATION": "0.85",
        "EXECUTOR_TENSOR_PARALLEL_SIZE": "2",
        "EXECUTOR_ENABLE_PREFIX_CACHING": "false",
        "EXECUTOR_SEED": "7",
        "EXECUTOR_CHAT_TEMPLATE": "/templates/chat.jinja",
        "EXECUTOR_HOST": "0.0.0.0",
        "EXECUTOR_PORT": "9001",
        "EXECUTOR_EXTRA_ARGS": "--max-num-seqs 64 --disable-log-requests",
    }
    cmd = serve_command(env)
    assert cmd[2] == "/models/pi2"
    assert flag(cmd, "--served-model-name") == "pi2-local"
    assert flag(cmd, "--dtype") == "bfloat16"
    assert flag(cmd, "--max-model-len") == "8192"
    assert flag(cmd, "--gpu-memory-utilization") == "0.85"
    assert flag(cmd, "--tensor-parallel-size") == "2"
    assert "--no-enable-prefix-caching" in cmd and "--enable-prefix-caching" not in cmd
    assert flag(cmd, "--seed") == "7"
    assert flag(cmd, "--chat-template") == "/templates/chat.jinja"
    assert flag(cmd, "--host") == "0.0.0.0"
    assert flag(cmd, "--port") == "9001"
    assert cmd[-3:] == ["--max-num-seqs", "64", "--disable-log-requests"]


def test_empty_values_mean_default() -> None:
    """Compose passes `${VAR:-}` as an empty string; that must mean 'unset', not a bad value."""
    env = {
        k: ""
        for k in (
            "EXECUTOR_MAX_MODEL_LEN",
            "EXECUTOR_GPU_MEMORY_UTILIZATION",
            "EXECUTOR_CHAT_TEMPLATE",
            "EXECUTOR_PORT",
        )
    }
    assert serve_command(env) == serve_command({})


def test_cpu_mode() -> None:
    cmd = serve_command(
        {"EXECUTOR_DEVICE": "cpu", "EXECUTOR_MODEL_PATH": "/m", "EXECUTOR_MAX_MODEL_LEN": "2048"}, python="/py"
    )
    assert cmd[:5] == ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert flag(cmd, "--dtype") == "float32"
    assert flag(cmd, "--max-model-len") == "2048"
    assert "--enforce-eager" in cmd
    assert "--tensor-parallel-size" not in cmd and "--gpu-memory-utilization" not in cmd


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"EXECUTOR_PORT": "http"}, "EXECUTOR_PORT"),
        ({"EXECUTOR_PORT": "70000"}, "EXECUTOR_PORT"),
        ({"EXECUTOR_MAX_MODEL_LEN": "-5"}, "EXECUTOR_MAX_MODEL_LEN"),
        ({"EXECUTOR_TENSOR_PARALLEL_SIZE": "0"}, "EXECUTOR_TENSOR_PARALLEL_SIZE"),
        ({"EXECUTOR_SEED": "x"}, "EXECUTOR_SEED"),
        ({"EXECUTOR_GPU_MEMORY_UTILIZATION": "1.5"}, "EXECUTOR_GPU_MEMORY_UTILIZATION"),
        ({"EXECUTOR_GPU_MEMORY_UTILIZATION": "most"}, "EXECUTOR_GPU_MEMORY_UTILIZATION"),
        ({"EXECUTOR_ENABLE_PREFIX_CACHING": "maybe"}, "EXECUTOR_ENABLE_PREFIX_CACHING"),
        ({"EXECUTOR_DTYPE": "int3"}, "EXECUTOR_DTYPE"),
        ({"EXECUTOR_DEVICE": "tpu"}, "EXECUTOR_DEVICE"),
        ({"EXECUTOR_DEVICE": "cpu", "EXECUTOR_TENSOR_PARALLEL_SIZE": "2"}, "EXECUTOR_TENSOR_PARALLEL_SIZE"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(LaunchConfigError, match=field):
        serve_command(env)


def test_api_key_goes_to_env_not_argv() -> None:
    env = {"EXECUTOR_API_KEY": "s3cret", "PATH": "/usr/bin"}
    assert all("s3cret" not in part for part in serve_command(env))
    out = serve_env(env)
    assert out["VLLM_API_KEY"] == "s3cret"
    assert "EXECUTOR_API_KEY" not in out
    assert out["PATH"] == "/usr/bin"


def test_cpu_env_is_applied() -> None:
    out = serve_env({"EXECUTOR_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2"})
    assert out["VLLM_TARGET_DEVICE"] == "cpu"
    assert out["VLLM_USE_AOT_COMPILE"] == "0"
    assert out["VLLM_CPU_KVCACHE_SPACE"] == "2"  # an explicit value wins over cpu_env's default


def test_cli_print_and_bad_value_exit() -> None:
    """The module as the image runs it: --print shows the command; a bad value exits non-zero naming it."""
    base = [sys.executable, "-m", "services.executor_vllm.entrypoint", "--print"]
    ok = subprocess.run(
        base,
        cwd=REPO,
        env={"EXECUTOR_PORT": "8123", "EXECUTOR_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "--port 8123" in ok.stdout and "--enforce-eager" in ok.stdout
    bad = subprocess.run(base, cwd=REPO, env={"EXECUTOR_PORT": "nope"}, capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "EXECUTOR_PORT must be an integer" in bad.stderr


def test_gpu_script_runs_standalone(tmp_path: Path) -> None:
    """The GPU image copies the file alone: it must run outside the package with the stdlib only."""
    script = tmp_path / "entrypoint.py"
    script.write_text((REPO / "services/executor_vllm/entrypoint.py").read_text())
    run = subprocess.run(
        [sys.executable, "-I", str(script), "--print"],
        env={"EXECUTOR_MODEL_PATH": "/w"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "vllm serve /w" in run.stdout


def test_the_served_name_is_the_one_the_reward_api_asks_for_everywhere() -> None:
    """One default served name (shared.wire): the entrypoint runs in the GPU image without ``shared`` and
    states it again; the Dockerfiles and compose state it too. A reward API left at its default finds the
    model of an executor left at its default, whichever way that executor was started."""
    import re

    from services.executor_vllm import cpu_launcher, entrypoint
    from services.reward_api.settings import Settings
    from shared.wire import EXECUTOR_SERVED_NAME

    assert entrypoint.DEFAULT_SERVED_NAME == cpu_launcher.DEFAULT_SERVED_NAME == EXECUTOR_SERVED_NAME
    assert Settings.model_fields["executor_model"].default == EXECUTOR_SERVED_NAME
    assert flag(serve_command({}), "--served-model-name") == EXECUTOR_SERVED_NAME
    for dockerfile in ("Dockerfile", "Dockerfile.cpu"):
        text = (REPO / "services" / "executor_vllm" / dockerfile).read_text()
        assert re.findall(r"EXECUTOR_SERVED_MODEL_NAME=(\S+)", text) == [EXECUTOR_SERVED_NAME], dockerfile
    compose = (REPO / "docker-compose.yml").read_text() + (REPO / "docker-compose.cpu.yml").read_text()
    defaults = re.findall(r"\$\{EXECUTOR_SERVED_MODEL_NAME:-([^}]*)\}", compose)
    assert defaults and set(defaults) == {EXECUTOR_SERVED_NAME}, defaults


def test_the_default_ports_are_declared_once_and_stated_alike_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """shared.wire's ports are the launchers' and the reward API's defaults; the entrypoint (no ``shared`` in the
    GPU image), the Dockerfiles, compose and the Kubernetes base state them again, equal."""
    import inspect
    import re

    from services.executor_vllm import cpu_launcher, entrypoint, gpu_launcher
    from services.reward_api import __main__ as reward_api_main
    from shared.wire import EXECUTOR_PORT, REWARD_API_PORT

    assert entrypoint.DEFAULT_PORT == EXECUTOR_PORT and flag(serve_command({}), "--port") == str(EXECUTOR_PORT)
    for launcher in (cpu_launcher, gpu_launcher):
        port = inspect.signature(launcher.serve).parameters["port"].default
        assert port.default == EXECUTOR_PORT, launcher.__name__
    seen: dict[str, object] = {}
    monkeypatch.setattr(reward_api_main.uvicorn, "run", lambda *_a, **kw: seen.update(kw))
    reward_api_main.main([])
    assert seen["port"] == REWARD_API_PORT
    for dockerfile in ("Dockerfile", "Dockerfile.cpu"):
        text = (REPO / "services" / "executor_vllm" / dockerfile).read_text()
        assert set(re.findall(r"EXECUTOR_PORT[=', ]+(\d+)", text)) == {str(EXECUTOR_PORT)}, dockerfile
    text = (REPO / "services" / "reward_api" / "Dockerfile").read_text()
    assert set(re.findall(r"(?:REWARD_API_PORT[=', ]+|--port\", \")(\d+)", text)) == {str(REWARD_API_PORT)}
    compose = (REPO / "docker-compose.yml").read_text() + (REPO / "docker-compose.cpu.yml").read_text()
    assert set(re.findall(r"\$\{EXECUTOR_PORT:-(\d+)\}", compose)) == {str(EXECUTOR_PORT)}
    assert set(re.findall(r"\$\{REWARD_API_PORT:-(\d+)\}", compose)) == {str(REWARD_API_PORT)}
    kustomize = (REPO / "deploy" / "base" / "kustomization.yaml").read_text()
    assert set(re.findall(r"EXECUTOR_PORT=(\d+)", kustomize)) == {str(EXECUTOR_PORT)}

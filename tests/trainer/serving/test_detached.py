"""Executors that outlive their command (``trainer serve``) without a GPU: the executor each gets, the
command and environment it would run with, ports, PID files, and the ``serve`` command's arguments."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from services.executor_vllm.gpu_launcher import GpuExecutor
from trainer.cli import app
from trainer.serving import detached
from trainer.serving.endpoint import ServingMode
from trainer.serving.executors import serving_mode


@pytest.fixture(autouse=True)
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STX_VLLM_RUN_DIR", str(tmp_path))
    return tmp_path


def test_executors_get_one_gpu_each_and_the_safe_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert detached.assign(["0", "1", "3"], 18201) == [("0", 18201), ("1", 18202), ("3", 18203)]
    with pytest.raises(ValueError, match="a GPU of its own"):
        detached.assign(["0", "0"], 18201)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = detached.executor("/m", "pi2", "2", 18201, 0.3).env()
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_the_vllm_command_serves_on_loopback_with_the_loops_flags(run_dir: Path) -> None:
    """It runs GpuExecutor's command (the one the loop uses), logging to the run dir."""
    ex = detached.executor("/m", "pi2", "0", 18201, 0.3, prefix_cache=False, eager=True)
    cmd = ex.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "18201"
    assert cmd[cmd.index("--served-model-name") + 1] == "pi2"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
    assert ex.log_path == run_dir / "stx-vllm-18201.log"
    graphs = detached.executor("/m", "pi2", "0", 1, 0.3)
    assert "--no-enable-prefix-caching" not in graphs.command() and "--enforce-eager" not in graphs.command()
    assert graphs.extra_env == {"VLLM_CACHE_ROOT": str(run_dir / "stx-vllm-1.vllm-cache")}  # a cache of its own
    assert cmd[:10] == GpuExecutor("/m", ["0"], "pi2", 18201, 0.3).command()[:10]


def test_without_a_gpu_it_is_the_vllm_cpu_executor() -> None:
    ex = detached.executor("/m", "pi2", None, 18201, 0.3)
    assert type(ex).__name__ == "CpuExecutor" and "CUDA_VISIBLE_DEVICES" not in ex.extra_env
    assert "--gpu-memory-utilization" not in ex.command() and "--enforce-eager" in ex.command()


def test_batch_invariant_mode_is_an_opt_in_of_gpu_executors(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--batch-invariant`` sets VLLM_BATCH_INVARIANT=1 for that executor only, and its serving mode says so;
    on CPU (a GPU setting) it is not set."""
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    bi = detached.executor("/m", "pi2", "0", 18201, 0.3, prefix_cache=False, eager=True, batch_invariant=True)
    assert bi.extra_env["VLLM_BATCH_INVARIANT"] == "1"
    assert serving_mode(bi) == ServingMode("GPU", eager=True, prefix_caching=False, batch_invariant=True)
    plain = detached.executor("/m", "pi2", "0", 18201, 0.3, prefix_cache=False, eager=True)
    assert "VLLM_BATCH_INVARIANT" not in plain.extra_env and serving_mode(plain).batch_invariant is False
    cpu = detached.executor("/m", "pi2", None, 18201, 0.3, batch_invariant=True)
    assert "VLLM_BATCH_INVARIANT" not in cpu.extra_env
    assert serving_mode(cpu) == ServingMode("CPU", eager=True, prefix_caching=True, batch_invariant=False)


class Launched:
    """Stands in for an executor: records how it was launched; its PID is this test's own (alive)."""

    calls: ClassVar[list[tuple[object, ...]]] = []

    def __init__(
        self, model: str, name: str, gpu: str | None, port: int, mem: float, prefix: bool, eager: bool, bi: bool,
        compile_graphs: bool = True,
    ):
        self.args = (model, gpu, port, mem, prefix, eager, bi, compile_graphs)
        self.url = f"http://127.0.0.1:{port}"
        Launched.calls.append((name, *self.args))

    def launch(self, die_with_parent: bool, append_log: bool) -> subprocess.Popen[bytes]:
        assert die_with_parent is False and append_log is True  # detached: outlives the command
        return subprocess.Popen([sys.executable, "-c", "pass"])


def test_serve_start_passes_its_options_and_leaves_pid_files(monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> None:
    Launched.calls = []
    monkeypatch.setattr(detached, "executor", Launched)
    args = ["serve", "start", "--model", "/m", "--name", "pi1", "--gpus", "0,2", "--port", "18201"]
    result = CliRunner().invoke(app, [*args, "--mem", "0.08", "--eager", "--no-prefix-cache", "--batch-invariant"])
    assert result.exit_code == 0, result.output
    assert Launched.calls == [
        ("pi1", "/m", "0", 18201, 0.08, False, True, True, True),
        ("pi1", "/m", "2", 18202, 0.08, False, True, True, True),
    ]
    assert {p.name for p in run_dir.glob("*.pid")} == {"stx-vllm-18201.pid", "stx-vllm-18202.pid"}
    Launched.calls = []
    cpu = CliRunner().invoke(app, ["serve", "start", "--model", "/m", "--name", "pi1", "--port", "18301"])
    on_cpu = ("pi1", "/m", None, 18301, 0.3, True, False, False, True)
    assert cpu.exit_code == 0 and Launched.calls == [on_cpu]
    Launched.calls = []
    graphs = CliRunner().invoke(app, [*args, "--graphs-only"])
    assert graphs.exit_code == 0 and Launched.calls[0][-1] is False  # decode graphs without torch.compile


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["start", "--model", "/m", "--name", "x", "--gpus", "0,0", "--port", "1"], "one executor each"),
        (["start", "--model", "/m", "--name", "x", "--gpus", ",", "--port", "1"], "one executor each"),
        (["start", "--model", "/m", "--name", "x", "--port", "1", "--mem", "1.5"], "--mem"),
        (["start", "--model", "/m", "--port", "1"], "--name"),
        (["wait", "--ports", "a,b"], "comma-separated ports"),
        (["stop", "--ports", ","], "at least one port"),
    ],
)
def test_serve_rejects_bad_arguments(args: list[str], error: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detached, "start", lambda *a: pytest.fail("must not start"))
    result = CliRunner().invoke(app, ["serve", *args])
    text = " ".join(result.output.replace("│", " ").split())  # the error box wraps lines
    assert result.exit_code == 2 and error in text, text


def test_stop_ends_the_process_group_and_forgets_it(run_dir: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (run_dir / "stx-vllm-18201.pid").write_text(str(proc.pid))
    detached.stop([18201, 18202])  # 18202: never started, nothing to do
    assert proc.wait(timeout=10) < 0 and not (run_dir / "stx-vllm-18201.pid").exists()


def test_wait_fails_with_the_log_of_an_executor_that_died(run_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (run_dir / "stx-vllm-18201.pid").write_text(str(proc.pid))
    (run_dir / "stx-vllm-18201.log").write_text("CUDA out of memory\n")
    with pytest.raises(SystemExit, match=r"(?s)port 18201 exited.*CUDA out of memory"):
        detached.wait([18201], timeout=5)


def test_wait_names_an_executor_stopped_while_it_waited(run_dir: Path) -> None:
    """Another command's ``serve stop`` ended the executor and removed its PID file: named, not a traceback."""
    with pytest.raises(SystemExit, match=r"port 18201: its PID file .*stx-vllm-18201\.pid is gone"):
        detached.wait([18201], timeout=5)


def test_a_dead_unreaped_executor_counts_as_dead() -> None:
    import os

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(100):  # exited, but not waited for: a zombie, as under `serve start --wait`
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    assert not detached.alive(proc.pid)
    proc.wait()
    assert detached.alive(os.getpid())

"""Serving a model: which executor a slot gets, replicas started together and always stopped, and an
external URL used only after it proved what it serves."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trainer.serving import executors
from trainer.serving.endpoint import ServingMode
from trainer.serving.executors import (
    SERVED_NAME,
    executor_for,
    replica_logs,
    serve_model,
    serve_replicas,
    serving_mode,
)
from trainer.serving.gpus import ExecutorSlot
from trainer.serving.identity import ServedModel


class SlowStartExecutorForTests:
    """Fault injection for the executors' start: each waits ``seconds`` to be ready; ``fail`` makes it raise."""

    def __init__(self, log: Path, seconds: float, fail: bool, spans: dict[str, tuple[float, float]]) -> None:
        self.log, self.seconds, self.fail, self.spans = log, seconds, fail, spans
        self.url = f"http://127.0.0.1:{9000 + len(spans)}/{log.name}"
        self.launched_by: int | None = None
        self.stopped = False

    def launch(self) -> None:
        self.launched_by = threading.get_ident()

    def wait_ready(self, timeout: float) -> SlowStartExecutorForTests:
        t0 = time.monotonic()
        time.sleep(self.seconds)
        self.spans[self.log.name] = (t0, time.monotonic())
        if self.fail:
            raise RuntimeError(f"{self.log.name}: engine core initialisation failed")
        return self

    def stop(self) -> None:
        self.stopped = True


def test_replicas_launch_in_the_callers_thread_wait_together_and_all_stop_when_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[SlowStartExecutorForTests] = []
    spans: dict[str, tuple[float, float]] = {}
    fail_on = ""

    def make(model: str, log: Path, slot: ExecutorSlot | None, **_: object) -> object:
        made.append(SlowStartExecutorForTests(log, 0.3, log.name == fail_on, spans))
        return made[-1]

    monkeypatch.setattr(executors, "executor_for", make)
    slots = [ExecutorSlot(("2",)), ExecutorSlot(("3",))]
    with serve_replicas("/m", replica_logs(tmp_path / "executor_c1", 2), slots) as endpoints:
        assert [ep.url for ep in endpoints] == [m.url for m in made] and not any(m.stopped for m in made)
        assert {ep.served_name for ep in endpoints} == {SERVED_NAME}
    (s0, e0), (s1, e1) = spans["executor_c1_0.log"], spans["executor_c1_1.log"]
    assert s0 < e1 and s1 < e0  # waited for side by side, not one after the other
    # launched by this thread: an owned child ends with the thread that started it (PR_SET_PDEATHSIG)
    assert all(m.launched_by == threading.get_ident() for m in made)
    assert all(m.stopped for m in made)
    made.clear()
    fail_on = "executor_c1_1.log"
    with (
        pytest.raises(RuntimeError, match=r"executor_c1_1\.log: engine core"),
        serve_replicas("/m", replica_logs(tmp_path / "executor_c1", 2), slots),
    ):
        pytest.fail("must not yield when a replica failed to start")
    assert len(made) == 2 and all(m.stopped for m in made)  # the one that did start is stopped too


def test_gpu_executors_are_eager_unless_asked_for_cuda_graphs(tmp_path: Path) -> None:
    slot = ExecutorSlot(("1",), 0.3)
    eager = executor_for("/m", tmp_path / "e.log", slot).command()
    graphs = executor_for("/m", tmp_path / "e.log", slot, eager=False).command()
    assert "--enforce-eager" in eager and "--enforce-eager" not in graphs
    # CUDA graphs compile: each executor into a cache of its own, beside its log (none to race on)
    assert executor_for("/m", tmp_path / "e.log", slot, eager=False).extra_env == {
        "VLLM_CACHE_ROOT": str(tmp_path / "e.vllm-cache")
    }
    assert executor_for("/m", tmp_path / "e.log", slot).extra_env == {}
    assert eager[eager.index("--gpu-memory-utilization") + 1] == "0.3"
    assert eager[eager.index("--served-model-name") + 1] == SERVED_NAME
    cpu = executor_for("/m", tmp_path / "e.log", None)
    assert type(cpu).__name__ == "CpuExecutor" and "--gpu-memory-utilization" not in cpu.command()


def test_an_external_url_is_used_only_after_it_proved_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[tuple[str, str, str]] = []

    def check(url: str, expected: str, what: str) -> ServedModel:
        checked.append((url, expected, what))  # the check itself: tests/trainer/serving/test_identity.py
        return ServedModel(url, "pi1-pipe-abc", None, "test", expected, "abc")

    monkeypatch.setattr(executors, "check_executor_url", check)
    with serve_model("/c1/hf", None, external="http://h:8001/v1", what="precompute") as ep:
        assert (ep.url, ep.served_name) == ("http://h:8001/v1", "pi1-pipe-abc")
        assert ep.identity is not None and ep.identity.expected_model == "/c1/hf"
    assert checked == [("http://h:8001/v1", "/c1/hf", "precompute")]


def test_serving_mode_is_what_the_executor_is_launched_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU: eager and prefix caching as asked (evaluation turns caching off); vLLM-CPU has neither switch and
    always runs eager with prefix caching on; batch-invariant mode from the executor's environment."""
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    slot = ExecutorSlot(("1",), 0.3)
    evaluation = executor_for("/m", tmp_path / "e.log", slot, prefix_caching=False)
    assert "--no-enable-prefix-caching" in evaluation.command()
    assert serving_mode(evaluation) == ServingMode("GPU", eager=True, prefix_caching=False, batch_invariant=False)
    graphs = executor_for("/m", tmp_path / "e.log", slot, eager=False, extra_env={"VLLM_BATCH_INVARIANT": "1"})
    assert serving_mode(graphs) == ServingMode("GPU", eager=False, prefix_caching=True, batch_invariant=True)
    cpu = executor_for("/m", tmp_path / "e.log", None, eager=False, prefix_caching=False)
    assert serving_mode(cpu) == ServingMode("CPU", eager=True, prefix_caching=True, batch_invariant=False)
    assert ServingMode().as_dict() == dict.fromkeys(("vllm_build", "eager", "prefix_caching", "batch_invariant"),
                                                    "unknown")  # fmt: skip


def test_serve_model_passes_prefix_caching_on_and_its_endpoint_carries_the_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    made: list[object] = []
    real = executors.executor_for

    def make(model: str, log: Path, slot: ExecutorSlot | None, **kw: object) -> object:
        ex = real(model, log, slot, **kw)  # type: ignore[arg-type]
        monkeypatch.setattr(ex, "launch", lambda: None)
        monkeypatch.setattr(ex, "wait_ready", lambda _t: ex)
        monkeypatch.setattr(ex, "stop", lambda: None)
        made.append(ex)
        return ex

    monkeypatch.setattr(executors, "executor_for", make)
    with serve_model("/m", tmp_path / "e.log", ExecutorSlot(("0",)), prefix_caching=False) as ep:
        assert ep.mode == ServingMode("GPU", eager=True, prefix_caching=False, batch_invariant=False)
    assert "--no-enable-prefix-caching" in made[-1].command()  # type: ignore[attr-defined]
    with serve_model("/m", tmp_path / "e.log", ExecutorSlot(("0",))) as ep:
        assert ep.mode is not None and ep.mode.prefix_caching is True  # vLLM's default, unless told

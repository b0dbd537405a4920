"""ExecutorPool: executors reused by model, started one engine per GPU at a time, released on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.serving.executors import ExecutorPool, ModelSpec, start_waves
from trainer.serving.gpus import ExecutorSlot


def spec(model: str, gpu: str | None) -> ModelSpec:
    return ModelSpec(model, model, ExecutorSlot((gpu,)) if gpu else None)


def names(waves: list[list[ModelSpec]]) -> list[list[str]]:
    return [[s.model for s in w] for w in waves]


def test_start_waves_one_engine_per_gpu_at_a_time() -> None:
    waves = start_waves([spec("a", "0"), spec("b", "1"), spec("c", "0"), spec("d", "1"), spec("e", "0")])
    assert names(waves) == [["a", "b"], ["c", "d"], ["e"]]
    assert start_waves([]) == []


def test_start_waves_starts_every_cpu_engine_at_once() -> None:
    """vLLM-CPU engines profile no memory: all of them start in the first wave, beside the GPUs' first ones."""
    assert names(start_waves([spec("a", None), spec("b", None), spec("c", None)])) == [["a", "b", "c"]]
    mixed = start_waves([spec("a", "0"), spec("b", None), spec("c", "0"), spec("d", None)])
    assert names(mixed) == [["b", "d", "a"], ["c"]]


def test_pool_reuses_by_model_and_stops_what_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, str]] = []
    asked: list[dict[str, Any]] = []

    class Fake:
        def __init__(self, model: str, _log: Path | None, _slot: Any, **kw: Any) -> None:
            self.model, self.url = model, f"http://{model}"
            asked.append(kw)

        def launch(self) -> None:
            log.append(("launch", self.model))

        def wait_ready(self, _t: float) -> None:
            log.append(("ready", self.model))

        def stop(self) -> None:
            log.append(("stop", self.model))

    monkeypatch.setattr("trainer.serving.executors.executor_for", Fake)
    with ExecutorPool() as pool:
        a, b = pool.ensure([spec("a", "0"), spec("b", "1")])
        assert (a.url, b.url) == ("http://a", "http://b")
        assert log == [("launch", "a"), ("launch", "b"), ("ready", "a"), ("ready", "b")]
        again = pool.ensure([spec("a", "0"), spec("c", "0")])
        assert [e.url for e in again] == ["http://a", "http://c"] and log[-2:] == [("launch", "c"), ("ready", "c")]
        assert pool.stop_except({"a"}) == ["b", "c"] and pool.models == ["a"]
    assert log[-1] == ("stop", "a")
    assert all(kw["prefix_caching"] is True and kw["eager"] is True for kw in asked)  # vLLM's default, unless told
    asked.clear()
    with ExecutorPool(prefix_caching=False) as pool:  # evaluation's pool: every executor without prefix caching
        pool.ensure([spec("a", "0"), spec("b", None)])
    assert [kw["prefix_caching"] for kw in asked] == [False, False]

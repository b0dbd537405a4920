"""The local-reward profile: GC accounting and one small profile through the real app."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import services.reward_api.routes as routes
from bench import profile_local as pl
from services.reward_api.scoring import off_loop


def test_gc_timer_counts_collections_per_generation_while_installed() -> None:
    timer = pl.GcTimer()
    with timer:
        assert timer in gc.callbacks
        gc.collect(0)
        gc.collect(2)
    assert timer not in gc.callbacks
    assert timer.collections[0] >= 1
    assert timer.collections[2] >= 1
    assert timer.seconds > 0
    before = list(timer.collections)
    gc.collect(2)  # uninstalled: not counted
    assert timer.collections == before


@pytest.mark.parametrize("frozen", [True, False])
def test_profile_through_the_app(golden_dir: Path, monkeypatch: pytest.MonkeyPatch, frozen: bool) -> None:
    monkeypatch.setattr(routes, "off_loop", off_loop)  # profile() inlines it; restored afterwards
    p = pl.profile("schema", n_requests=2, batch=16, golden=str(golden_dir), frozen=frozen)
    assert (p["kind"], p["requests"], p["batch"], p["startup_heap_frozen"]) == ("schema", 2, 16, frozen)
    assert len(p["by_own_time"]) == pl.TOP
    assert len(p["gc_collections"]) == 3
    # the scoring itself is in the profile: a function of shared/ (the rewards, parsing, metrics) among the top
    functions = [r["function"] for r in p["by_cumulative"] + p["by_own_time"]]
    assert any("shared/" in f for f in functions), functions
    assert gc.get_freeze_count() == 0  # the lifespan released what it froze

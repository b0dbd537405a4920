"""The app's lifespan: the start-up heap is frozen out of the cyclic GC while it serves, released at shutdown."""

from __future__ import annotations

import asyncio
import gc
import weakref

from services.reward_api.app import create_app
from services.reward_api.settings import Settings


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


def _alive(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_startup_heap_frozen_while_serving_and_released_at_shutdown() -> None:
    gc.unfreeze()
    app = create_app(Settings(log_level="WARNING"))
    garbage = _Node()
    garbage_ref = weakref.ref(garbage)
    del garbage
    seen: dict[str, object] = {}

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            seen["frozen"] = gc.get_freeze_count()
            seen["app_collectable"] = _alive(app)
            seen["garbage_alive"] = garbage_ref() is not None

    asyncio.run(serve())
    frozen = seen["frozen"]
    assert isinstance(frozen, int) and frozen > 10_000  # modules, the app, validators: the whole start-up heap
    assert seen["app_collectable"] is False  # the app is among the frozen: a full collection skips it
    assert seen["garbage_alive"] is False  # garbage was collected before the freeze, not frozen with it
    assert gc.get_freeze_count() == 0
    assert _alive(app)

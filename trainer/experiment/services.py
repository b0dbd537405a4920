"""The servers an experiment's stages share, asked of :mod:`trainer.serving` and kept until the experiment
ends: executors of the phases' outputs (:class:`~trainer.serving.executors.ExecutorPool`: reused by model
folder, so an arm whose best step was step 0 is served by its start policy's executor) and the two reward
APIs (``local``: no executor; ``pipe``: its pipeline calls go to the partner π2ˢ's executor, which eval
then reuses). Everything here is called from the recipe's main thread, which owns the children.

The executors run eager without prefix caching, the mode in which an evaluation repeats
(docs/reliability.md#evaluations-that-repeat): Phase D is scored on them, C2's schemas and the preflight
come from them, and the ``pipe`` reward API's calls share the partner's executor with eval, so they are
served alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainer.experiment.design import Design
from trainer.experiment.placement import ArmPlacement
from trainer.experiment.plan import LOCAL, PIPE
from trainer.experiment.workdir import Workdir
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import ExecutorPool, ModelSpec
from trainer.serving.reward_api import reward_api_process

# uvicorn workers of the reward APIs on GPU nodes (as the A/B runs used); one each on CPU, where cores are few
GPU_WORKERS = {LOCAL: 4, PIPE: 8}


class Services(contextlib.AbstractContextManager["Services"]):
    def __init__(
        self, design: Design, placement: ArmPlacement, wd: Workdir, reward_max_tokens: int | None = None
    ) -> None:
        self.design, self.placement, self.wd = design, placement, wd
        # the pipeline reward's Stage-2 answers (None: the reward API's default)
        self.pipe_settings: dict[str, Any] = {"max_tokens": reward_max_tokens} if reward_max_tokens else {}
        self.models: dict[str, str] = {}  # phase -> the model folder it produced (set as they become known)
        self.pool = ExecutorPool(eager=True, prefix_caching=False)
        self._apis: dict[str, tuple[contextlib.ExitStack, str]] = {}

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def arm_of(self, phase: str) -> int:
        """Arm A (0) serves the trained policy and arm A's output; arm B (1) the partner and arm B's."""
        return 0 if phase in (self.design.start, self.design.arms[0]) else 1

    def spec(self, phase: str) -> ModelSpec:
        name = self.design.served_name(phase)
        slot = self.placement.executor_slot(self.arm_of(phase))
        return ModelSpec(self.models[phase], name, slot, self.wd.logs / f"executor_{name}.log")

    def serve(self, phases: Iterable[str]) -> dict[str, Endpoint]:
        """Endpoints of these phases' outputs; the ones not served yet start (one engine per GPU at a time,
        every vLLM-CPU one at once)."""
        wanted = list(dict.fromkeys(phases))
        return dict(zip(wanted, self.pool.ensure([self.spec(p) for p in wanted]), strict=True))

    def keep_only(self, phases: Iterable[str], apis: Iterable[str]) -> list[str]:
        """Stop every reward API but ``apis`` and every executor but those of ``phases``' models (and the
        one behind a kept pipeline reward API): on CPU, memory for the next stage. The models stopped."""
        keep_apis = set(apis)
        for kind in [k for k in self._apis if k not in keep_apis]:
            self._apis.pop(kind)[0].close()
        keep = {*phases, *((self.design.partner,) if PIPE in self._apis else ())}
        return self.pool.release({self.models[p] for p in keep if p in self.models})

    def reward_api(self, kind: str) -> str:
        """The URL of the ``local`` or ``pipe`` reward API, started on first use."""
        if kind not in self._apis:
            executors: tuple[Endpoint, ...] = ()
            settings: dict[str, Any] = {}
            if kind == PIPE:
                executors = (self.serve([self.design.partner])[self.design.partner],)
                settings = self.pipe_settings
            workers = 1 if self.placement.on_cpu else GPU_WORKERS[kind]
            stack = contextlib.ExitStack()
            log: Path = self.wd.logs / f"reward_api_{kind}.log"
            api = stack.enter_context(
                reward_api_process(log, executors=executors, workers=workers, log_level="WARNING", **settings)
            )
            self._apis[kind] = (stack, api.url)
        return self._apis[kind][1]

    def reward_apis(self, kinds: Iterable[str]) -> Mapping[str, str]:
        return {k: self.reward_api(k) for k in kinds}

    def close(self) -> None:
        """Reward APIs first (their pipeline calls go to the executors), then the executors."""
        try:
            for stack, _url in self._apis.values():
                stack.close()
            self._apis.clear()
        finally:
            self.pool.close()

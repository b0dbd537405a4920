"""What a served model is to its clients: a base URL and the model name requests carry, and how it is
served (what decides whether a rerun gives the same answers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # only a type here: the two-stage runner imports Endpoint without the identity check's deps
    from trainer.serving.identity import ServedModel

UNKNOWN = "unknown"


@dataclass(frozen=True)
class ServingMode:
    """How an executor generates, as far as it decides whether the same requests at the same concurrency
    get the same answers again (docs/reliability.md#evaluations-that-repeat): the vLLM build, eager or
    CUDA graphs, prefix caching, vLLM's batch-invariant mode. None: not known (a server started elsewhere)."""

    build: Literal["GPU", "CPU"] | None = None
    eager: bool | None = None
    prefix_caching: bool | None = None
    batch_invariant: bool | None = None

    def as_dict(self) -> dict[str, str | bool]:
        """The record's fields, ``"unknown"`` for what is not known."""
        fields = {
            "vllm_build": self.build,
            "eager": self.eager,
            "prefix_caching": self.prefix_caching,
            "batch_invariant": self.batch_invariant,
        }
        return {k: UNKNOWN if v is None else v for k, v in fields.items()}


@dataclass(frozen=True)
class Endpoint:
    """A model being served. ``identity`` is what an external URL proved it serves (None: we serve it);
    ``mode`` how an executor we started serves it (None: not ours, not known)."""

    url: str
    served_name: str
    identity: ServedModel | None = None
    mode: ServingMode | None = None

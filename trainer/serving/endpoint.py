"""What a served model is to its clients: a base URL and the model name requests carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only a type here: the two-stage runner imports Endpoint without the identity check's deps
    from trainer.serving.identity import ServedModel


@dataclass(frozen=True)
class Endpoint:
    """A model being served. ``identity`` is what an external URL proved it serves (None: we serve it)."""

    url: str
    served_name: str
    identity: ServedModel | None = None

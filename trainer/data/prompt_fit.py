"""Does a Stage-2 prompt fit the executor's context? Counted offline with the executor model's tokenizer.

In C1 the reward service builds a Stage-2 prompt (document + predicted schema) for the frozen π2
executor; a document whose prompt cannot fit the executor's ``max_model_len`` can only earn the
``prompt_too_long`` penalty (docs/reward_api.md). ``trainer data build`` and the C2 precompute therefore
count such documents and drop them, the way VERL's ``filter_overlong_prompts`` drops over-long Stage-1
prompts. For C1 the gold schema stands in for the prediction π1 will make (the schema it is trained to
produce); for C2 the prompt is exact.

The count is the executor's own: its tokenizer with its chat template and the generation prompt, the
same tokens vLLM's ``/tokenize`` returns. vLLM needs room for at least one generated token, so a prompt
fits when it has fewer tokens than ``max_model_len``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Stage2Fit:
    """The executor's tokenizer (a Hugging Face model directory) and its context length."""

    tokenizer_dir: Path
    max_model_len: int
    _tokenizer: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ValueError(f"--stage2-max-len must be positive, got {self.max_model_len}")
        from transformers import AutoTokenizer  # heavy: only when the check is asked for

        self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def tokens(self, messages: Sequence[dict[str, str]]) -> int:
        ids = self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)

    def fits(self, messages: Sequence[dict[str, str]]) -> bool:
        return self.tokens(messages) < self.max_model_len

    def describe(self) -> dict[str, Any]:
        """For the manifest: what the documents were measured against."""
        return {"stage2_tokenizer": str(self.tokenizer_dir), "stage2_max_model_len": self.max_model_len}

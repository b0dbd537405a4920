"""Does a prompt fit? The Stage-2 executor's context (:class:`Stage2Fit`) and the phases' length limits
(:class:`PhaseLengths`), counted offline with the model's tokenizer.

In C1 the reward service builds a Stage-2 prompt (document + predicted schema) for the frozen π2
executor; a document whose prompt cannot fit the executor's ``max_model_len`` can only earn the
``prompt_too_long`` penalty (docs/reward_api.md). ``trainer data build`` and the C2 precompute therefore
count such documents and drop them, the way VERL's ``filter_overlong_prompts`` drops over-long Stage-1
prompts. For C1 the gold schema stands in for the prediction π1 will make (the schema it is trained to
produce); for C2 the prompt is exact.

The count is the executor's own: its tokenizer with its chat template and the generation prompt, the
same tokens vLLM's ``/tokenize`` returns. vLLM needs room for at least one generated token, so a prompt
fits when it has fewer tokens than ``max_model_len``.

:class:`PhaseLengths` is ``trainer data build --tokenizer DIR --max-prompt-len N --max-sft-len N``: it counts
each RL prompt and each SFT conversation the way the phase's length filter will (the same functions:
:mod:`trainer.data.prompt_filter`, :mod:`trainer.data.sft_length_filter`) and reports the rows over
the limit by id in the manifest. It drops nothing: the phases' filters drop those rows at their start,
against the limit of the profile they run with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


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


@dataclass
class PhaseLengths:
    """The policy's tokenizer (a Hugging Face model directory) and the phases' limits: ``max_prompt_len`` for
    an RL phase's prompt (``data.max_prompt_length``), ``max_sft_len`` for an SFT conversation
    (``data.max_length``). Either may be None (not checked)."""

    tokenizer_dir: Path
    max_prompt_len: int | None = None
    max_sft_len: int | None = None
    # processes that render the templates (the phases' filters use 8); one: the build's cost is its few
    # long documents, and forking under the build's progress thread is not worth it
    workers: int = 1
    _tokenizer: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for name, value in (("--max-prompt-len", self.max_prompt_len), ("--max-sft-len", self.max_sft_len)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_prompt_len is None and self.max_sft_len is None:
            raise ValueError("--tokenizer needs --max-prompt-len, --max-sft-len or both")
        from transformers import AutoTokenizer  # heavy: only when the check is asked for

        self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def limit(self, kind: Literal["sft", "rl"]) -> tuple[str, int | None]:
        """The phase setting that the rows of ``kind`` are held to, and its value here."""
        if kind == "sft":
            return "data.max_length", self.max_sft_len
        return "data.max_prompt_length", self.max_prompt_len

    def lengths(self, kind: Literal["sft", "rl"], messages: Sequence[Any]) -> list[int]:
        """Tokens per row as the phase's length filter counts them (no chat-template kwargs: the configs set none)."""
        from trainer.data.prompt_filter import count_lengths, count_many
        from trainer.data.sft_length_filter import count_conversation_lengths

        counter = count_conversation_lengths if kind == "sft" else count_lengths
        return count_many(messages, self._tokenizer, str(self.tokenizer_dir), {}, self.workers, counter=counter)

    def over(self, kind: Literal["sft", "rl"], messages: Sequence[Any], ids: Sequence[str]) -> dict[str, Any] | None:
        """The rows over the limit of ``kind``: ``{rows, over, longest, ids}`` (None where ``kind`` has no limit)."""
        _, limit = self.limit(kind)
        if limit is None:
            return None
        lengths = self.lengths(kind, messages)
        too_long = [rid for rid, n in zip(ids, lengths, strict=True) if n > limit]
        return {"rows": len(lengths), "over": len(too_long), "longest": max(lengths, default=0), "ids": too_long}

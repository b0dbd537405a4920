"""The length filter of an SFT phase (A1, A2), run by the launcher before torchrun starts VERL's SFT trainer.

VERL's ``MultiTurnSFTDataset`` tokenises a conversation only when a batch asks for it: with ``truncation:
error`` one conversation over ``data.max_length`` fails the whole phase at that step, after VERL's
start-up, with ``sequence_length=... is larger than self.max_length=...`` and no row named (a 1 MB
document or a schema of 10,000 columns passes ``trainer data build``).

Here every conversation of the train and validation files is counted the way that dataset counts it
(:func:`count_conversation_lengths`), once per conversation and tokenizer: the lengths are cached under
``$STX_CACHE_DIR/sft_lengths/`` as the prompt filter caches its own. Then, as the prompt filter does
(:mod:`trainer.data.prompt_filter`, whose machinery this reuses with another :class:`~.prompt_filter.Rule`):

- every conversation fits: the files are used as they are;
- some do not: the rows that fit are written to ``<out>/sft_data/<split>_<n>_<file>``, and the launcher
  points ``data.train_files`` / ``data.val_files`` at them. The count, the limit and the ids of the rows
  dropped (a row's ``id`` column, else ``<file>:<row>``) are printed to ``train.log``, recorded in
  ``checkpoints/sft_length_filter.json`` and copied into ``phase_result.json`` (``length_filter``);
- none does: the phase fails before torchrun with a message naming the split's files and
  ``data.max_length`` (the record's ``error`` and the phase result's).

``sft_length_filter.enabled=false`` leaves VERL alone (``truncation: error`` then fails the phase in VERL);
so does a ``data.truncation`` other than ``error`` (VERL cuts such conversations instead).

The same process writes the epoch plan of :mod:`trainer.data.sft_epochs` (from the rows it kept) where
``epoch_selection.enabled`` is on.

It runs as its own process, ``python -m trainer.data.sft_length_filter --config-path <configs>
--config-name a1_sft sft_profile=... <overrides>``, with the phase's environment and the arguments
torchrun gets, so the config it reads is the one VERL composes (the launcher runs phases side by side in
threads; Hydra's compose and the ``oc.env`` interpolations are per process).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.data import sft_epochs
from trainer.data.prompt_filter import (
    AllTooLong,
    Counting,
    LengthCache,
    Rule,
    SplitFilter,
    filter_split,
    record,
    tokenizer_key,
)
from trainer.data.prompt_filter import cache_dir as prompt_cache_dir
from trainer.data.train_set import files_of

RECORD_FILE = "sft_length_filter.json"
MODULE = "trainer.data.sft_length_filter"


def _system_prompt_len(tokenizer: Any, template_kwargs: dict[str, Any]) -> int:
    """The tokens of the template's default system block: VERL's ``extract_system_prompt_and_generation``
    (one empty user turn rendered alone and twice; what the second adds is a turn, the rest is the block)."""
    one = [{"role": "user", "content": ""}]

    def n(messages: list[dict[str, str]]) -> int:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False, **template_kwargs)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    single, double = n(one), n(one * 2)
    turn = double - single
    return single - turn if turn else 0


def count_conversation_lengths(
    conversations: Sequence[Any], tokenizer: Any, template_kwargs: dict[str, Any]
) -> list[int]:
    """Conversation lengths in tokens as VERL's ``MultiTurnSFTDataset`` counts them before it compares with
    ``data.max_length``: each message rendered alone by the chat template (no generation prompt), tokenised
    without special tokens, the default system block taken off every message but the first and the system
    ones, the pieces summed (no ``tools`` column: the data build writes none)."""
    if not conversations:
        return []
    strip = _system_prompt_len(tokenizer, template_kwargs)
    texts: list[str] = []
    cut: list[int] = []
    owner: list[int] = []
    for c, conversation in enumerate(conversations):
        for i, message in enumerate(conversation):
            m = dict(message)
            texts.append(
                tokenizer.apply_chat_template([m], add_generation_prompt=False, tokenize=False, **template_kwargs)
            )
            cut.append(strip if i != 0 and m.get("role") != "system" else 0)
            owner.append(c)
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"] if texts else []
    lengths = [0] * len(conversations)
    for c, x, k in zip(owner, ids, cut, strict=True):
        lengths[c] += max(len(x) - k, 0)
    return lengths


CONVERSATIONS = Rule(
    tag="sft_length_filter", unit="conversations", limit_key="data.max_length", counter=count_conversation_lengths
)


def cache_dir() -> Path:
    return prompt_cache_dir().parent / "sft_lengths"


def _template_kwargs(data: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    raw = data.get("apply_chat_template_kwargs")
    kwargs = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else dict(raw or {})
    assert isinstance(kwargs, dict)
    return {str(k): v for k, v in kwargs.items() if k not in ("tokenize", "return_dict", "return_tensors")}


def apply(config: Any, out_dir: Path) -> list[SplitFilter] | None:
    """Count the SFT phase's train and validation conversations; where some are over ``data.max_length``,
    write the rest under ``out_dir`` (``config.data.*_files`` changed in place). None where
    ``sft_length_filter.enabled`` is off or ``data.truncation`` is not ``error``. Raises
    :class:`~.prompt_filter.AllTooLong` where none fits."""
    from omegaconf import open_dict
    from transformers import AutoTokenizer

    block = config.get("sft_length_filter") or {}
    data, model = config.data, config.model
    if not block.get("enabled", False) or data.get("truncation", "error") != "error":
        return None
    tokenizer_dir = str(model.get("tokenizer_path") or model.path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=bool(model.get("trust_remote_code")))
    custom = model.get("custom_chat_template")
    if custom:
        tokenizer.chat_template = custom
    template_kwargs = _template_kwargs(data)
    limit = int(data.max_length)
    key = tokenizer_key(tokenizer_dir, {**template_kwargs, "custom_chat_template": custom or None})
    cache = LengthCache.load(Path(str(block.get("cache_dir") or cache_dir())) / f"{key}.json")
    # pool workers load the tokenizer from its folder, without a custom template
    workers = 1 if custom else int(block.get("workers") or min(8, os.cpu_count() or 1))
    splits = [s for s in ("train", "val") if data.get(f"{s}_files")]
    column = str(data.get("messages_key") or "messages")
    counting = Counting(column, tokenizer, tokenizer_dir, template_kwargs, cache, workers, rule=CONVERSATIONS)
    results = [filter_split(split, files_of(data[f"{split}_files"]), limit, counting, out_dir) for split in splits]
    cache.save()
    with open_dict(config):
        for r in results:
            if r.dropped:
                config.data[f"{r.split}_files"] = r.used_files if len(r.used_files) > 1 else r.used_files[0]
    return results


def file_overrides(results: Sequence[SplitFilter]) -> tuple[str, ...]:
    """The Hydra overrides that point the phase at the filtered files (none where nothing was dropped)."""
    out = []
    for r in results:
        if r.dropped:
            files = r.used_files[0] if len(r.used_files) == 1 else "[" + ",".join(r.used_files) + "]"
            out.append(f"data.{r.split}_files={files}")
    return tuple(out)


def command(phase_command: Sequence[str]) -> list[str]:
    """This check's command line for an SFT phase's torchrun command: the same config arguments
    (``--config-path DIR --config-name NAME`` and the overrides)."""
    cmd = list(phase_command)
    return [sys.executable, "-m", MODULE, *cmd[cmd.index("--config-path") :]]


def compose(config_dir: str, config_name: str, overrides: Sequence[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name, overrides=list(overrides))


def main(argv: Sequence[str] | None = None) -> int:
    """``--config-path DIR --config-name NAME [overrides]``: filter, print, record; exit 2 where no
    conversation of a split fits."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--config-path" or args[2] != "--config-name":
        print(f"usage: python -m {MODULE} --config-path DIR --config-name NAME [overrides]", file=sys.stderr)
        return 2
    config = compose(args[1], args[3], args[4:])
    ckpt_dir = Path(str(config.trainer.default_local_dir))
    try:
        results = apply(config, ckpt_dir.parent / "sft_data")
    except AllTooLong as exc:
        record(ckpt_dir, [], error=str(exc), name=RECORD_FILE)
        print(f"[sft_length_filter] error: {exc}", file=sys.stderr, flush=True)
        return 2
    if results is None:
        print("[sft_length_filter] off (sft_length_filter.enabled=false)", flush=True)
    else:
        for r in results:
            print(r.describe(), flush=True)
    kept = next((r.rows - r.dropped for r in results or [] if r.split == "train"), None)
    try:
        epochs = sft_epochs.write_plan(config, ckpt_dir, kept)
    except sft_epochs.EpochPlanError as exc:
        record(ckpt_dir, results or [], error=f"epoch_selection: {exc}", name=RECORD_FILE)
        print(f"[sft_epochs] error: {exc}", file=sys.stderr, flush=True)
        return 2
    if epochs is not None:
        print(
            f"[sft_epochs] {epochs.rows} train rows, batch {epochs.batch_size} on {epochs.dp_size} ranks: "
            f"{epochs.steps_per_epoch} steps an epoch; a checkpoint and the validation loss at every epoch's end "
            f"({' '.join(epochs.overrides)})",
            flush=True,
        )
    if results is not None:
        record(ckpt_dir, results, name=RECORD_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The prompt length filter of a GRPO phase, run once per prompt file and tokenizer, before Ray starts.

VERL's ``RLHFDataset`` (``data.filter_overlong_prompts``) renders and tokenises every prompt one at a time
at every phase start, in the TaskRunner, for the train and the validation files: 39-90 s of each start
on the GPU nodes (2,048 to 25,797 train prompts plus 3,663 validation prompts). The same files come back
phase after phase (B1 and C1 share the Stage-1 prompts; every phase validates on its split).

Here the lengths are counted the way VERL counts them (the tokenizer's chat template with the
generation prompt and ``data.apply_chat_template_kwargs``, no special tokens added: the same numbers),
rendered in a pool of processes and tokenised in batches, and cached by content: one file per tokenizer
and template under ``$STX_CACHE_DIR/prompt_lengths/`` maps each prompt's hash to its length, so a later
phase finds the prompts an earlier one counted (B1 and C1 share the Stage-1 prompts in other files;
every phase's validation split holds the same documents). Then:

- every prompt fits ``data.max_prompt_length``: the files are used as they are;
- some do not: the rows that fit are written to ``<out>/prompts/<split>_<n>_<file>`` and the phase reads
  those. The count, the limit and the ids of the rows dropped are printed (``train.log``) and recorded in
  ``checkpoints/prompt_filter.json``, which the launcher copies into ``phase_result.json``
  (``length_filter``), where VERL's filter only printed the length it kept;
- none does: the phase fails before Ray with :class:`AllTooLong`, naming the split's files and
  ``data.max_prompt_length`` (the message is the record's ``error`` and the phase result's).

Either way VERL's own filter is turned off (``data.filter_overlong_prompts=false``); ``truncation:
error`` still fails a prompt that is too long. ``prompt_filter.enabled=false`` keeps VERL's filter.

The SFT phases' length filter (:mod:`trainer.data.sft_length_filter`) is this filter with another
:class:`Rule`: what is counted, how, and against which setting.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from services.executor_vllm.gguf_source import cache_dir as project_cache_dir
from trainer.data.train_set import files_of

RECORD_FILE = "prompt_filter.json"
# ids shown in train.log and phase_result.json; the record keeps them all
SHOWN_IDS = 20

Counter = Callable[[Sequence[Any], Any, dict[str, Any]], list[int]]


class AllTooLong(ValueError):
    """Every row of a split is over the limit: the phase would have nothing to train or validate on."""


@dataclass
class SplitFilter:
    split: str
    files: list[str]
    rows: int
    dropped: int
    limit: int
    longest: int
    dropped_ids: list[str] = field(default_factory=list)
    used_files: list[str] = field(default_factory=list)
    from_cache: int = 0
    limit_key: str = "data.max_prompt_length"
    tag: str = "prompt_filter"
    unit: str = "prompts"

    def describe(self) -> str:
        head = (f"[{self.tag}] {self.split}: {self.rows} {self.unit}, longest {self.longest} tokens, "
                f"limit {self.limit_key} {self.limit}")  # fmt: skip
        if not self.dropped:
            return head + f": none dropped ({self.from_cache} lengths from the cache)"
        shown = ", ".join(self.dropped_ids[:SHOWN_IDS]) + (" ..." if self.dropped > SHOWN_IDS else "")
        return head + f": {self.dropped} dropped as too long ({shown}); the phase reads {self.used_files}"

    def summary(self) -> dict[str, Any]:
        """For ``phase_result.json``: the count, the limit and the first ids (the record has them all)."""
        return {
            "split": self.split,
            "rows": self.rows,
            "dropped": self.dropped,
            "limit_key": self.limit_key,
            "limit": self.limit,
            "longest": self.longest,
            "first_dropped_ids": self.dropped_ids[:SHOWN_IDS],
            "used_files": self.used_files,
        }


@dataclass(frozen=True)
class Rule:
    """What a length filter counts, how, and against which setting: a GRPO phase's prompts (this module) or
    an SFT phase's conversations (:mod:`trainer.data.sft_length_filter`)."""

    tag: str
    unit: str
    limit_key: str
    # a module-level function (the process pool pickles it by name)
    counter: Counter


def cache_dir() -> Path:
    return project_cache_dir() / "prompt_lengths"


def tokenizer_key(tokenizer_dir: str, template_kwargs: dict[str, Any]) -> str:
    """The cache file of a tokenizer + template: its token and template files' contents, and the kwargs."""
    tok = Path(tokenizer_dir)
    digest = hashlib.sha256(json.dumps(template_kwargs, sort_keys=True).encode())
    for f in sorted(tok.glob("*")) if tok.is_dir() else []:
        if f.is_file() and ("token" in f.name or "template" in f.name):
            digest.update(f.name.encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:20]


def prompt_key(messages: Any) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


def count_lengths(messages: Sequence[Any], tokenizer: Any, template_kwargs: dict[str, Any]) -> list[int]:
    """Prompt lengths in tokens as VERL's filter counts them (chat template + generation prompt, no special
    tokens added): the template rendered per prompt, the ids counted in one batched tokenizer call."""
    texts = [
        tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False, **template_kwargs)
        for m in messages
    ]
    if not texts:
        return []
    ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [len(x) for x in ids]


_POOL_TOKENIZER: Any = None


def _pool_init(tokenizer_dir: str) -> None:
    global _POOL_TOKENIZER
    from transformers import AutoTokenizer

    _POOL_TOKENIZER = AutoTokenizer.from_pretrained(tokenizer_dir)


def _pool_count(args: tuple[list[Any], dict[str, Any], Counter]) -> list[int]:
    return args[2](args[0], _POOL_TOKENIZER, args[1])


def count_many(
    messages: Sequence[Any],
    tokenizer: Any,
    tokenizer_dir: str,
    template_kwargs: dict[str, Any],
    workers: int,
    min_pool: int = 2000,
    counter: Counter = count_lengths,
) -> list[int]:
    """``counter`` (:func:`count_lengths`) over a pool of ``workers`` processes where there are enough rows to
    pay for it."""
    if workers <= 1 or len(messages) < min_pool:
        return counter(messages, tokenizer, template_kwargs)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    size = -(-len(messages) // (workers * 4))
    chunks = [(list(messages[i : i + size]), template_kwargs, counter) for i in range(0, len(messages), size)]
    ctx = mp.get_context("fork")  # the driver, before Ray and CUDA: nothing that forking would break
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_init, initargs=(tokenizer_dir,)) as pool:
        return [n for part in pool.map(_pool_count, chunks) for n in part]


@dataclass
class LengthCache:
    """Prompt hash -> length, for one tokenizer and template (a JSON file; written atomically)."""

    path: Path
    lengths: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> LengthCache:
        try:
            raw = json.loads(path.read_text()) if path.is_file() else {}
            return cls(path, {str(k): int(v) for k, v in raw.items()})
        except (ValueError, TypeError, AttributeError):
            return cls(path)  # a damaged cache is counted again

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.lengths))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only cache folder: counted again next time


PROMPTS = Rule(tag="prompt_filter", unit="prompts", limit_key="data.max_prompt_length", counter=count_lengths)


@dataclass(frozen=True)
class Counting:
    """How a filter counts a parquet's rows: the column that holds them, the tokenizer (its object and the
    folder pool workers load it from) with the chat template's arguments, the cache of lengths already
    counted, the worker processes and the rule."""

    column: str
    tokenizer: Any
    tokenizer_dir: str
    template_kwargs: dict[str, Any]
    cache: LengthCache
    workers: int = 1
    rule: Rule = PROMPTS


def file_lengths(path: Path, counting: Counting) -> tuple[list[int], int]:
    """Lengths of every row of one parquet, and how many of them came from the cache (which learns the rest)."""
    c, cache = counting, counting.cache
    messages = pq.read_table(path, columns=[c.column]).column(c.column).to_pylist()
    keys = [prompt_key(m) for m in messages]
    todo = [i for i, k in enumerate(keys) if k not in cache.lengths]
    todo_messages = [messages[i] for i in todo]
    counted = count_many(
        todo_messages, c.tokenizer, c.tokenizer_dir, c.template_kwargs, c.workers, counter=c.rule.counter
    )
    for i, n in zip(todo, counted, strict=True):
        cache.lengths[keys[i]] = n
    return [cache.lengths[k] for k in keys], len(keys) - len(todo)


def _row_ids(path: Path) -> list[str]:
    """An RL row's ``extra_info.id``, an SFT row's ``id`` (``trainer data build``), else ``<file>:<row>``."""
    table = pq.read_table(path)
    fallback = [f"{path.name}:{i}" for i in range(table.num_rows)]
    if "extra_info" in table.column_names:
        infos = table.column("extra_info").to_pylist()
        return [str((info or {}).get("id") or fallback[i]) for i, info in enumerate(infos)]
    if "id" in table.column_names:
        return [str(rid or fallback[i]) for i, rid in enumerate(table.column("id").to_pylist())]
    return fallback


def filter_split(split: str, files: list[str], limit: int, counting: Counting, out_dir: Path) -> SplitFilter:
    """One split's files: counted (or read from the cache), and rewritten under ``out_dir`` without the rows
    over ``limit``."""
    rule = counting.rule
    result = SplitFilter(split, files, rows=0, dropped=0, limit=limit, longest=0, used_files=list(files),
                         limit_key=rule.limit_key, tag=rule.tag, unit=rule.unit)  # fmt: skip
    from_cache = 0
    kept_tables = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ValueError(f"data.{split}_files: {f} does not exist")
        lengths, hits = file_lengths(path, counting)
        from_cache += hits
        result.rows += len(lengths)
        result.longest = max([result.longest, *lengths])
        over = [i for i, n in enumerate(lengths) if n > limit]
        if over:
            ids = _row_ids(path)
            result.dropped += len(over)
            result.dropped_ids += [ids[i] for i in over]
        keep = [i for i, n in enumerate(lengths) if n <= limit]
        kept_tables.append((path, keep, len(lengths)))
    result.from_cache = from_cache
    if result.dropped:
        if result.dropped == result.rows:
            raise AllTooLong(f"data.{split}_files: all {result.rows} {rule.unit} are longer than "
                             f"{rule.limit_key} {limit} tokens (longest {result.longest}; "
                             f"{', '.join(files)})")  # fmt: skip
        out_dir.mkdir(parents=True, exist_ok=True)
        result.used_files = []
        for n, (path, keep, total) in enumerate(kept_tables):
            if len(keep) == total:
                result.used_files.append(str(path))
                continue
            dest = out_dir / f"{split}_{n}_{path.name}"
            pq.write_table(pq.read_table(path).take(keep), dest)
            result.used_files.append(str(dest))
    return result


def apply(config: Any, out_dir: Path) -> list[SplitFilter] | None:
    """Filter the phase's train and validation files here and turn VERL's filter off (``config`` changed in
    place). None where ``prompt_filter.enabled`` is off or VERL's filter is off already."""
    from omegaconf import OmegaConf, open_dict
    from transformers import AutoTokenizer

    block = config.get("prompt_filter") or {}
    data = config.data
    if not block.get("enabled", False) or not data.get("filter_overlong_prompts", True):
        return None
    tokenizer_dir = str(config.actor_rollout_ref.model.get("tokenizer_path") or config.actor_rollout_ref.model.path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    raw = data.get("apply_chat_template_kwargs")
    kwargs = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else dict(raw or {})
    assert isinstance(kwargs, dict)
    template_kwargs = {str(k): v for k, v in kwargs.items() if k not in ("tokenize", "return_dict", "return_tensors")}
    limit = int(data.max_prompt_length)
    cache = LengthCache.load(
        Path(str(block.get("cache_dir") or cache_dir())) / f"{tokenizer_key(tokenizer_dir, template_kwargs)}.json"
    )
    workers = int(block.get("workers") or min(8, os.cpu_count() or 1))
    counting = Counting(str(data.prompt_key), tokenizer, tokenizer_dir, template_kwargs, cache, workers)
    results = [
        filter_split(split, files_of(data[f"{split}_files"]), limit, counting, out_dir) for split in ("train", "val")
    ]
    cache.save()
    with open_dict(config):
        for r in results:
            if r.dropped:
                config.data[f"{r.split}_files"] = r.used_files if len(r.used_files) > 1 else r.used_files[0]
        config.data.filter_overlong_prompts = False
    return results


def record(ckpt_dir: Path, results: list[SplitFilter], error: str | None = None, name: str = RECORD_FILE) -> Path:
    """``{"splits": [every split, all its dropped ids], "error": why the phase stopped here, or null}``."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / name
    path.write_text(json.dumps({"splits": [asdict(r) for r in results], "error": error}, indent=2) + "\n")
    return path


def read_record(path: Path) -> tuple[list[SplitFilter], str | None] | None:
    """A record of :func:`record` (None where none was written or it cannot be read)."""
    try:
        raw = json.loads(path.read_text())
        return [SplitFilter(**s) for s in raw["splits"]], raw.get("error")
    except (OSError, ValueError, TypeError, KeyError):
        return None

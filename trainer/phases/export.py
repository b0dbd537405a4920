"""Export a VERL FSDP checkpoint to a Hugging Face directory that vLLM (the executor) can serve.

It runs VERL's own merger, ``python -m verl.model_merger merge --backend fsdp --local_dir
<ckpt>/global_step_N/actor --target_dir <hf_dir>`` (SFT checkpoints have no ``actor/`` level),
then checks that the result loads as a model directory: ``config.json``, weights and tokenizer.

An exported model names no attention implementation: the phase's (``override_config.attn_implementation``, such
as ``packed_sdpa`` of :mod:`trainer.in_verl.packed_attention`, registered only inside a phase's processes) is a
training-time choice that VERL writes into the checkpoint's ``huggingface/config.json``; the merger, vLLM and
transformers elsewhere would refuse a name they do not know. :func:`drop_attn_implementation` removes it from
the checkpoint's config before the merge and from the exported one after.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

WEIGHT_SUFFIXES = (".safetensors", ".bin")


class ExportError(RuntimeError):
    """The merger failed or produced a directory vLLM could not serve."""


def fsdp_dir(step_dir: Path, kind: Literal["sft", "grpo"]) -> Path:
    """Where the FSDP shards of a step live: ``actor/`` for RL, the step dir (or its ``actor/``) for SFT."""
    if (step_dir / "actor").is_dir():
        return step_dir / "actor"
    if kind == "grpo":
        raise ExportError(f"{step_dir}: no actor/ checkpoint directory")
    return step_dir


def merge_command(local_dir: Path, target_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(local_dir),
        "--target_dir",
        str(target_dir),
    ]


ATTN_KEYS = ("attn_implementation", "_attn_implementation")


def drop_attn_implementation(config_json: Path) -> bool:
    """Remove the attention implementation from a Hugging Face ``config.json`` (rewritten atomically); True if it
    named one."""
    if not config_json.is_file():
        return False
    config = json.loads(config_json.read_text())
    if not any(k in config for k in ATTN_KEYS):
        return False
    for key in ATTN_KEYS:
        config.pop(key, None)
    tmp = config_json.with_name(config_json.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(config_json)
    return True


def check_hf_dir(path: Path) -> None:
    """Raise :class:`ExportError` unless ``path`` holds config, weights and a tokenizer."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not (path.is_dir() and any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir())):
        missing.append("weights (*.safetensors)")
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        missing.append("tokenizer")
    if missing:
        raise ExportError(f"{path}: exported model directory lacks {', '.join(missing)}")


def export_checkpoint(
    step_dir: Path, target_dir: Path, kind: Literal["sft", "grpo"] = "grpo", log: Path | None = None
) -> Path:
    """Merge ``step_dir`` into ``target_dir`` (replaced if present) and verify it; returns ``target_dir``."""
    local = fsdp_dir(step_dir, kind)
    if target_dir.exists():
        shutil.rmtree(target_dir)
    drop_attn_implementation(local / "huggingface" / "config.json")
    cmd = merge_command(local, target_dir)
    with (log or Path("/dev/null")).open("ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise ExportError(f"model_merger exited {proc.returncode}: {' '.join(cmd)}")
    # The merger copies the tokenizer from huggingface/ when it is there; make sure it is.
    hf_src = local / "huggingface"
    if hf_src.is_dir():
        for f in hf_src.iterdir():
            if f.is_file() and not (target_dir / f.name).exists():
                shutil.copy2(f, target_dir / f.name)
    drop_attn_implementation(target_dir / "config.json")
    check_hf_dir(target_dir)
    return target_dir

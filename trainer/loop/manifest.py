"""What the loop's manifest (``loop_manifest.json``, a :class:`trainer.runs.manifest.Manifest`) records, and the
loop's content keys beside the phase rule of :mod:`trainer.runs.reuse`.

The manifest records the config whole (``config``), the inputs (``inputs``: the golden files by sha256
and every setting), the phase configs' sha256 (``configs``), and after every step what it made; it is
rewritten after every step. A phase's result is reused only for the same inputs (:mod:`trainer.runs.reuse`);
C2's precomputed data and Phase D's scores only for the same key (``precompute_key.json``, ``eval_key.json``:
model contents, golden files, settings).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from shared.golden import sha256_file
from trainer.loop.config import LoopConfig
from trainer.phases.launch import CONFIG_DIR
from trainer.runs.manifest import Manifest
from trainer.serving.identity import fingerprint

MANIFEST = "loop_manifest.json"
PRECOMPUTE_KEY = "precompute_key.json"
EVAL_KEY = "eval_key.json"


def config_record(cfg: LoopConfig) -> dict[str, Any]:
    """Every field of the config, as JSON values (paths as strings, tuples as lists)."""
    record: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    return record


def record_inputs(manifest: Manifest, cfg: LoopConfig) -> None:
    """``config``: the config whole; ``inputs``: every setting, with the golden files by content and the
    RFT settings as one entry (the keys earlier manifests had); ``configs``: the phase configs' sha256."""
    config = config_record(cfg)
    golden = {str(p): sha256_file(p) for p in sorted(cfg.golden.glob("common_*_schemas.jsonl"))}
    rft = {"k": cfg.rft_k, "threshold": cfg.rft_threshold} if cfg.rft else None
    manifest.set("config", config)
    manifest.set("inputs", config | {"golden": golden, "rft": rft})
    manifest.set(
        "configs", {str(p.relative_to(CONFIG_DIR)): sha256_file(p) for p in sorted(CONFIG_DIR.rglob("*.yaml"))}
    )


def golden_sha256(cfg: LoopConfig, splits: Sequence[str]) -> dict[str, str]:
    return {s: sha256_file(cfg.golden / f"common_{s}_schemas.jsonl") for s in splits}


def precompute_key(cfg: LoopConfig, pi1_pipe: str) -> dict[str, Any]:
    """What the C2 data depends on: π1ʳ-pipe's content, the golden files, the settings."""
    from shared import PROMPT_VERSION

    return {
        "schema_model": fingerprint(pi1_pipe),
        "golden": golden_sha256(cfg, ("train", "validation")),
        "config": {
            "limit": cfg.limit,
            "max_tokens": cfg.eval_max_tokens,
            "on_invalid": "gold",
            "prompt_version": PROMPT_VERSION,
            "train_prompts": cfg.c2_train_prompts,
            # only when given: a key recorded before the option existed still matches
            **({"train_sources": list(cfg.rl_sources)} if cfg.rl_sources else {}),
        },
    }


def eval_key(cfg: LoopConfig, settings: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """What Phase D's scores depend on: every setting's model contents, the test file, the settings."""
    from shared import PROMPT_VERSION

    return {
        "settings": {name: [fingerprint(pi1), fingerprint(pi2)] for name, (pi1, pi2) in settings.items()},
        "golden": golden_sha256(cfg, ("test",)),
        "config": {
            "eval_limit": cfg.eval_limit,
            "max_tokens": cfg.eval_max_tokens,
            "prompt_version": PROMPT_VERSION,
            # how the executors served (trainer/loop/phase_d_step.py): answers repeat only in one mode
            "serving": {"eager": cfg.executor_eager, "prefix_caching": False},
        },
    }

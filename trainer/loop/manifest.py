"""The loop's manifest (``loop_manifest.json``) and the content keys that decide what a rerun reuses.

The manifest records the config whole (``config``), the inputs (``inputs``: the golden files by sha256
and every setting), the phase configs' sha256 (``configs``), and after every step what it made; it is
rewritten after every step. A phase's result is reused only for the same inputs (``phase_inputs.json``:
its start model's content, its data files, the profile, the user's overrides and the phase's config files'
content; a difference is an error that names it); C2's precomputed data and Phase D's scores only for the same
key (``precompute_key.json``, ``eval_key.json``: model contents, golden files, settings).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.loop.config import LoopConfig
from trainer.phases.launch import CONFIG_DIR
from trainer.serving.identity import fingerprint

MANIFEST = "loop_manifest.json"
PRECOMPUTE_KEY = "precompute_key.json"
EVAL_KEY = "eval_key.json"
PHASE_INPUTS = "phase_inputs.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is none (a key never written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Manifest:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    # Phases beside each other (A1 and A2, B1 and B2, Phase-D settings) record from their own threads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path) -> Manifest:
        return cls(path, json.loads(path.read_text()) if path.is_file() else {})

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.data["updated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
            tmp.replace(self.path)


def config_record(cfg: LoopConfig) -> dict[str, Any]:
    """Every field of the config, as JSON values (paths as strings, tuples as lists)."""
    record: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    return record


def record_inputs(manifest: Manifest, cfg: LoopConfig) -> None:
    """``config``: the config whole; ``inputs``: every setting, with the golden files by content and the
    RFT settings as one entry (the keys earlier manifests had); ``configs``: the phase configs' sha256."""
    config = config_record(cfg)
    golden = {str(p): sha256(p) for p in sorted(cfg.golden.glob("common_*_schemas.jsonl"))}
    rft = {"k": cfg.rft_k, "threshold": cfg.rft_threshold} if cfg.rft else None
    manifest.set("config", config)
    manifest.set("inputs", config | {"golden": golden, "rft": rft})
    manifest.set("configs", {str(p.relative_to(CONFIG_DIR)): sha256(p) for p in sorted(CONFIG_DIR.rglob("*.yaml"))})


def golden_sha256(cfg: LoopConfig, splits: Sequence[str]) -> dict[str, str]:
    return {s: sha256(cfg.golden / f"common_{s}_schemas.jsonl") for s in splits}


def phase_inputs(
    name: str, model: str, data_dir: Path, profile: str = "gpu", overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """What a phase's result depends on: its start model's content, its data files, the profile, the user's
    overrides and the content of the config files its command composes."""
    from trainer.phases.launch import check_profile, composed_files

    files = sorted((data_dir / name).glob("*.parquet")) if (data_dir / name).is_dir() else []
    composed = composed_files(name, check_profile(profile))
    return {
        "model_in": fingerprint(model),
        "data": {f.name: sha256(f) for f in files},
        "profile": profile,
        "overrides": list(overrides),
        "configs": {str(p.relative_to(CONFIG_DIR)): sha256(p) for p in composed},
    }


def inputs_difference(recorded: dict[str, Any], now: dict[str, Any]) -> str:
    """The keys in which two phase inputs differ, each with both values."""
    keys = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
    return "; ".join(f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys)


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

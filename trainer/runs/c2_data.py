"""C2's data: a π1's greedy schemas (served as an evaluation is, so a rerun writes the same ones) for a seeded
``--c2-train-prompts`` train documents (of ``--rl-sources`` where given) and every validation one, as Stage-2
prompts; reused only for the same key (``precompute_key.json``: the π1's content, the golden files, the settings)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from shared.golden import sha256_file
from trainer.runs.phase_d_part import generation
from trainer.runs.record import read_json
from trainer.serving.identity import fingerprint

if TYPE_CHECKING:
    from trainer.runs.config import RunConfig
    from trainer.runs.context import RunContext
    from trainer.serving.endpoint import Endpoint

PRECOMPUTE_KEY = "precompute_key.json"
OnInvalid = Literal["skip", "gold"]


def precompute_key(cfg: RunConfig, model: str, on_invalid: OnInvalid) -> dict[str, Any]:
    """What C2's data depends on: the π1's content, the golden train and validation files, the settings."""
    from shared import PROMPT_VERSION

    return {
        "schema_model": fingerprint(model),
        "golden": {s: sha256_file(cfg.golden / f"common_{s}_schemas.jsonl") for s in ("train", "validation")},
        "config": {
            "limit": cfg.limit, "max_tokens": cfg.eval_max_tokens, "on_invalid": on_invalid,
            "prompt_version": PROMPT_VERSION, "train_prompts": cfg.c2_train_prompts,
            "train_sources": list(cfg.rl_sources),
        },
    }  # fmt: skip


def is_done(data_dir: Path, key: dict[str, Any]) -> bool:
    c2 = data_dir / "c2"
    return (c2 / "train.parquet").is_file() and read_json(c2 / PRECOMPUTE_KEY) == key


def write_c2_data(
    ctx: RunContext, pi1: Endpoint, model: str, data_dir: Path, tag: str, on_invalid: OnInvalid
) -> None:
    """``data_dir/c2/`` from the schemas the π1 at ``pi1`` (``model``) writes; invalid ones skipped or given the
    gold schema; recorded as ``precompute:<tag>``."""
    from trainer.data.precompute import precompute_c2
    from trainer.evaluation.generation import GenerationClient
    from trainer.evaluation.inference import schema_predictor

    cfg = ctx.cfg
    key = precompute_key(cfg, model, on_invalid)
    if is_done(data_dir, key):
        return
    rep = precompute_c2(
        cfg.golden, data_dir, schema_predictor(GenerationClient(pi1.url, pi1.served_name, generation(cfg))),
        pi1.served_name, on_invalid=on_invalid, limit=cfg.limit, sample={"train": cfg.c2_train_prompts},
        sources={"train": cfg.rl_sources} if cfg.rl_sources else None,
        max_truncated_share=cfg.eval_max_truncated_share,
    )  # fmt: skip
    (data_dir / "c2" / PRECOMPUTE_KEY).write_text(json.dumps(key, indent=2) + "\n")
    served = pi1.identity.as_dict() if pi1.identity else None
    ctx.record.set(f"precompute:{tag}", dataclasses.asdict(rep) | {"schema_model": model, "key": key, "served": served})

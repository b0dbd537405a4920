"""The step before C2: π1ʳ-pipe, served locally (or checked at ``--pi1-pipe-url``), predicts the schemas
C2 trains on (:func:`trainer.data.precompute.precompute_c2`); reused only for the same content key."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from trainer.loop.manifest import PRECOMPUTE_KEY, precompute_key, read_json
from trainer.loop.workspace import Workspace
from trainer.serving.executors import serve_model
from trainer.serving.gpus import ExecutorSlot


def precompute_c2_data(ws: Workspace, pi1_pipe: str, data_dir: Path, tag: str) -> None:
    """C2's data from π1ʳ-pipe's schemas; reused only if its key (model content, golden, config) matches."""
    from trainer.data.precompute import precompute_c2
    from trainer.evaluation.generation import GenerationClient, GenerationConfig
    from trainer.evaluation.inference import schema_predictor

    cfg = ws.cfg
    key = precompute_key(cfg, pi1_pipe)
    key_path = data_dir / "c2" / PRECOMPUTE_KEY
    if (data_dir / "c2" / "train.parquet").is_file() and read_json(key_path) == key:
        return
    gen = GenerationConfig(max_tokens=cfg.eval_max_tokens)
    slot = ExecutorSlot(ws.plan.gpus[:1]) if ws.plan else None
    log = ws.logs / f"executor_precompute_{tag}.log"
    external, what = cfg.pi1_pipe_url, f"precompute {tag} (π1ʳ-pipe)"
    with serve_model(pi1_pipe, log, slot, external=external, what=what, eager=cfg.executor_eager) as ep:
        served = ep.identity.as_dict() if ep.identity else None
        if served is not None:
            ws.manifest.set(f"served:precompute_{tag}", served)
        rep = precompute_c2(
            cfg.golden,
            data_dir,
            schema_predictor(GenerationClient(ep.url, ep.served_name, gen)),
            ep.served_name,
            on_invalid="gold",
            limit=cfg.limit,
            sample={"train": cfg.c2_train_prompts} if cfg.c2_train_prompts else None,
        )
    key_path.write_text(json.dumps(key, indent=2) + "\n")
    ws.manifest.set(f"precompute:{tag}", asdict(rep) | {"schema_model": pi1_pipe, "key": key, "served": served})

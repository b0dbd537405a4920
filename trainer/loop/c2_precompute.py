"""The step before C2: π1ʳ-pipe, served locally (or checked at ``--pi1-pipe-url``), predicts the schemas
C2 trains on (:func:`write_c2_data`, which the experiments call with an executor of their own); reused only
for the same content key."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trainer.loop.manifest import PRECOMPUTE_KEY, precompute_key
from trainer.loop.workspace import Workspace
from trainer.runs.manifest import read_json
from trainer.serving.endpoint import Endpoint
from trainer.serving.executors import serve_model
from trainer.serving.gpus import ExecutorSlot

if TYPE_CHECKING:
    from trainer.data.precompute import PrecomputeReport
    from trainer.evaluation.generation import GenerationConfig


def write_c2_data(
    golden: Path,
    data_dir: Path,
    pi1: Endpoint,
    gen: GenerationConfig,
    *,
    on_invalid: Literal["skip", "gold"],
    limit: int | None = None,
    train_sample: int | None = None,
    train_sources: Sequence[str] = (),
    max_truncated_share: float = 0.02,
) -> PrecomputeReport:
    """``data_dir/c2/``: Stage-2 prompts on the schemas the π1 at ``pi1`` writes for the train (a seeded
    ``train_sample`` of it, drawn from ``train_sources``' documents where given) and validation documents;
    invalid schemas skipped or given the gold one."""
    from trainer.data.precompute import precompute_c2
    from trainer.evaluation.generation import GenerationClient
    from trainer.evaluation.inference import schema_predictor

    return precompute_c2(
        golden,
        data_dir,
        schema_predictor(GenerationClient(pi1.url, pi1.served_name, gen)),
        pi1.served_name,
        on_invalid=on_invalid,
        limit=limit,
        sample={"train": train_sample} if train_sample else None,
        sources={"train": train_sources} if train_sources else None,
        max_truncated_share=max_truncated_share,
    )


def precompute_c2_data(ws: Workspace, pi1_pipe: str, data_dir: Path, tag: str) -> None:
    """C2's data from π1ʳ-pipe's schemas; reused only if its key (model content, golden, config) matches."""
    from trainer.evaluation.generation import GenerationConfig

    cfg = ws.cfg
    key = precompute_key(cfg, pi1_pipe)
    key_path = data_dir / "c2" / PRECOMPUTE_KEY
    if (data_dir / "c2" / "train.parquet").is_file() and read_json(key_path) == key:
        return
    gen = GenerationConfig(max_tokens=cfg.eval_max_tokens)
    slot = ExecutorSlot(ws.plan.gpus[:1]) if ws.plan else None
    log = ws.logs / f"executor_precompute_{tag}.log"
    external, what = cfg.pi1_pipe_url, f"precompute {tag} (π1ʳ-pipe)"
    # C2 trains on these (greedy) schemas: served as evaluation is, without prefix caching, a rerun at the same
    # concurrency writes the same ones (docs/reliability.md#evaluations-that-repeat)
    with serve_model(
        pi1_pipe, log, slot, external=external, what=what, eager=cfg.executor_eager, prefix_caching=False
    ) as ep:
        served = ep.identity.as_dict() if ep.identity else None
        if served is not None:
            ws.manifest.set(f"served:precompute_{tag}", served)
        rep = write_c2_data(
            cfg.golden, data_dir, ep, gen, on_invalid="gold", limit=cfg.limit, train_sample=cfg.c2_train_prompts,
            train_sources=cfg.rl_sources, max_truncated_share=cfg.eval_max_truncated_share,
        )  # fmt: skip
    key_path.write_text(json.dumps(key, indent=2) + "\n")
    ws.manifest.set(f"precompute:{tag}", asdict(rep) | {"schema_model": pi1_pipe, "key": key, "served": served})

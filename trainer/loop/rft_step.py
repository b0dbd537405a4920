"""``--rft``: the RFT baseline beside RL (:mod:`trainer.rft`): π1ˢ and π2ˢ, each served locally, sample k
outputs per training prompt, reward_api scores them, and A1/A2 fine-tune π1ˢ/π2ˢ on the best ≥ threshold."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainer.loop.phase_step import phase_done
from trainer.loop.workspace import Workspace
from trainer.phases.registry import RewardKind, sft_phase_for
from trainer.serving.executors import serve_model

# (phase, start model, out dir, data dir) → the exported model (the loop's phase step)
SftStep = Callable[[str, str, Path, Path], str]


def rft_baseline(ws: Workspace, sft: SftStep, pi1_sft: str, pi2_sft: str) -> tuple[str, str]:
    """RFT of π1ˢ (schema reward) and π2ˢ (table reward): sample, keep the best, SFT on them."""
    from trainer.rft import RftConfig, build_rft_data

    cfg = ws.cfg
    gen = RftConfig(k=cfg.rft_k, threshold=cfg.rft_threshold, max_tokens=cfg.eval_max_tokens)
    models: dict[str, str] = {}
    starts: tuple[tuple[RewardKind, str], ...] = (("schema", pi1_sft), ("table", pi2_sft))
    for reward, start in starts:
        base = ws.out / "rft" / reward
        phase = sft_phase_for(reward)
        if phase_done(base / "sft") is None and not (base / "data" / phase / "train.parquet").is_file():
            with (
                # its samples are scored: served as evaluation is (docs/reliability.md#evaluations-that-repeat)
                serve_model(start, ws.logs / f"executor_rft_{reward}.log", prefix_caching=False) as ep,
                ws.reward_api(None, cfg.reward_url, f"rft_{reward}") as url,
            ):
                rep = build_rft_data(cfg.golden, base, reward, ep.url, ep.served_name, url, gen, cfg.limit)
            ws.manifest.set(f"rft:{reward}", rep.as_dict() | {"policy": start})
        models[reward] = sft(phase, start, base / "sft", base / "data")
    return models["schema"], models["table"]

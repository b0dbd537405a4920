"""One phase of the loop: reused when its recorded result was trained from the same inputs, else (after
the optional advantage preflight) launched, recorded in the manifest, and its exported model returned."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from trainer.loop.workspace import Workspace
from trainer.phases.launch import PhaseResult, PhaseRun, PhaseRunner
from trainer.phases.registry import get_phase, reward_of
from trainer.phases.seeds import rl_seed_overrides
from trainer.runs import reuse
from trainer.runs.reuse import phase_inputs
from trainer.serving.executors import serve_model
from trainer.serving.gpus import ExecutorSlot, Placement


def phase_done(out_dir: Path) -> PhaseResult | None:
    """The recorded result if the phase finished and its exported model is present."""
    return reuse.finished(out_dir)


def run_phase_step(
    ws: Workspace,
    runner: PhaseRunner,
    name: str,
    model: str,
    reward_url: str | None,
    out_dir: Path,
    data_dir: Path | None = None,
    placement: Placement | None = None,
    reward_model: str | None = None,
) -> str:
    """Run one phase unless its recorded output exists; record it; the exported HF directory.

    ``placement`` (GPU profile): the phase's GPUs and the overrides they imply; the user's
    overrides come after them and win. ``reward_model``: the model behind the phase's reward (C1: the frozen π2),
    one of its inputs.
    """
    cfg = ws.cfg
    data_dir = data_dir or ws.data
    key = str(out_dir.relative_to(ws.out))
    sft = get_phase(name).kind == "sft"
    sources = () if sft else cfg.rl_sources
    user_overrides = cfg.sft_overrides if sft else (*rl_seed_overrides(cfg.rl_seed), *cfg.overrides)
    inputs = phase_inputs(name, model, data_dir, cfg.profile, user_overrides, reward_model)
    inputs |= {"train_sources": list(sources)} if sources else {}
    inputs |= {"train_mix": mix_inputs(cfg.rl_mix_share)} if sources and mixes_phase(name, cfg.rl_mix_share) else {}
    done = reuse.reuse_or_refuse(out_dir, inputs, key)
    if done is None:
        if not sft and cfg.preflight_min is not None and reward_url:
            preflight(ws, name, model, reward_url, out_dir, placement)
        placed: tuple[str, ...] = ()
        if placement is not None:
            placed = placement.sft_overrides() if sft else placement.grpo_overrides()
        if sources:  # before the user's overrides, which win
            chosen = source_set(ws, name, key, data_dir, sources)
            placed = (*placed, f"data.train_files={mixed_set(ws, name, key, data_dir, chosen)}")
        run = PhaseRun(
            phase=get_phase(name),
            profile=cfg.profile,
            data_dir=data_dir,
            out_dir=out_dir,
            model_path=model,
            reward_url=reward_url,
            overrides=(*placed, *user_overrides),
            nproc=placement.nproc if placement else 1,
            gpus=placement.gpus if placement else (),
            reward_model=reward_model,
        )
        done = runner(run)
        if done.status != "ok" or not done.hf_dir:
            ws.manifest.set(f"phase:{key}", asdict(done))
            why = f": {done.error}" if done.error else ""
            raise RuntimeError(f"phase {key} failed (exit {done.exit_code}){why}; log {out_dir / 'train.log'}")
        reuse.record(out_dir, inputs)
    ws.manifest.set(f"phase:{key}", asdict(done))
    assert done.hf_dir is not None
    return done.hf_dir


def source_set(ws: Workspace, name: str, key: str, data_dir: Path, sources: tuple[str, ...]) -> Path:
    """``--rl-sources``: the phase's train split restricted to ``sources``, written under ``train_sets/``
    (named by the phase's folder, so loop 2's C1/C2 get their own); recorded in the manifest."""
    from trainer.phases.train_set import source_set_path, write_source_set

    out = source_set_path(ws.out / "train_sets", key.replace("/", "_"), sources)
    ws.manifest.set(f"train_set:{key}", write_source_set(data_dir / name / "train.parquet", sources, out))
    return out


def mixes_phase(name: str, share: float) -> bool:
    from trainer.phases.train_mix import mixes

    return mixes(get_phase(name).built_from_golden, share)


def mix_inputs(share: float) -> dict[str, float | int]:
    from trainer.phases.train_mix import MIX_SEED

    return {"share": share, "seed": MIX_SEED}


def mixed_set(ws: Workspace, name: str, key: str, data_dir: Path, chosen: Path) -> Path:
    """``--rl-mix-share``: the phase's chosen set with the other sources' share mixed in, beside it under
    ``train_sets/`` and written again each time, as the source set is (a finished phase trained with another
    share is refused by its recorded inputs); ``chosen`` itself where the phase is not mixed."""
    from trainer.phases.train_mix import mixed_set_path, write_mixed_set

    share = ws.cfg.rl_mix_share
    if not mixes_phase(name, share):
        return chosen
    out = mixed_set_path(chosen.parent, chosen)
    ws.manifest.set(f"train_mix:{key}", write_mixed_set(chosen, data_dir / name / "train.parquet", share, out))
    return out


def preflight(
    ws: Workspace, name: str, model: str, reward_url: str, out_dir: Path, placement: Placement | None
) -> None:
    """The advantage check of ``name``'s start policy; stops the loop when its groups teach too little."""
    from trainer.phases.preflight import advantage_check, write_report

    cfg = ws.cfg
    slot = ExecutorSlot(placement.gpus[:1], 0.3) if placement else None
    key = str(out_dir.relative_to(ws.out))
    # served as evaluation is, without prefix caching (docs/reliability.md#evaluations-that-repeat)
    log = ws.logs / f"executor_preflight_{name}.log"
    with serve_model(model, log, slot, eager=cfg.executor_eager, prefix_caching=False) as ep:
        rep = advantage_check(
            cfg.golden, reward_of(name), ep.url, ep.served_name, reward_url,
            min_informative=float(cfg.preflight_min or 0.0), max_tokens=cfg.eval_max_tokens,
            sources=cfg.rl_sources or None,
        )  # fmt: skip
    write_report(rep, out_dir / "preflight.json")
    ws.manifest.set(f"preflight:{key}", rep.as_dict())
    if not rep.ok:
        raise RuntimeError(
            f"phase {key}: {rep.verdict()} Raise the rollout temperature or n, filter the prompts "
            f"(trainer preflight-filter), or start from another policy (report: {out_dir / 'preflight.json'})"
        )

"""The stages of an experiment, each a function of the :class:`~trainer.experiment.context.Context` it works
in; the recipe (``recipe.py``) brings their servers up first and runs them in the plan's order
(``plan.py`` says what each runs and when it counts as done)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shared.golden import source_of
from trainer.experiment.context import Context, ExperimentStopped
from trainer.experiment.plan import phase_ok, preflight_phases, reward_api_of
from trainer.phases.launch import PhaseRun
from trainer.phases.registry import reward_of
from trainer.runs.parallel import first_error
from trainer.serving.endpoint import Endpoint


def sft(ctx: Context) -> None:
    from trainer.data.datasets import build_datasets
    from trainer.data.sft_mix import SourceMix, check_reuse

    phases = ctx.data_phases()
    mix = SourceMix.parse(ctx.cfg.sft_mix) if ctx.cfg.sft_mix else None
    if not all((ctx.wd.data / p / "train.parquet").is_file() for p in phases):
        counts = build_datasets(ctx.cfg.golden, ctx.wd.data, list(phases), limit=ctx.cfg.limit, sft_mix=mix)
        ctx.manifest.set("data", counts)
    check_reuse(ctx.wd.data, mix)
    ctx.run_phases([(p, run) for p, run in sft_runs(ctx) if not ctx.reusable(run)], stagger_s=0.0)


def sft_runs(ctx: Context) -> list[tuple[str, PhaseRun]]:
    """A1 and A2, the start policy's first (each on its placement)."""
    pair = ("a1", "a2") if ctx.design.start == "a1" else ("a2", "a1")
    return [(p, ctx.sft_phase(p, ctx.placement.sft(i))) for i, p in enumerate(pair)]


def refuse_stale(ctx: Context, stage: str) -> None:
    """Before a finished stage is skipped: each of its phases must have finished from the inputs this run would
    give it (StaleResultError, naming the differences, if not). The arms are rebuilt as the rl stage would
    launch them (their reward API's URL is no input)."""
    if stage == "sft":
        runs = sft_runs(ctx)
    elif stage == "rl":
        t = ctx.need_temperature()
        runs = [(arm, ctx.arm_phase(i, "", t)) for i, arm in enumerate(ctx.design.arms)]
    else:
        return
    for _phase, run in runs:
        ctx.reusable(run)


def preflight(ctx: Context) -> None:
    """Each swept phase's temperatures in turn, the phases at once (one policy executor serves them all)."""
    from trainer.phases.preflight import advantage_check, write_report

    cfg, d = ctx.cfg, ctx.design
    policy = ctx.sv.serve([d.start])[d.start]

    def sweep(phase: str) -> None:
        url = ctx.sv.reward_api(reward_api_of(phase))
        for t in cfg.temps:
            path = ctx.wd.report(phase, t)
            if path.is_file():
                continue
            rep = advantage_check(
                cfg.golden, reward_of(phase), policy.url, policy.served_name, url, n=cfg.preflight_n,
                prompts=cfg.preflight_prompts, temperature=t, max_tokens=cfg.preflight_max_tokens,
                min_informative=0.0, min_improvable=0.0, sources=cfg.preflight_sources or None,
            )  # fmt: skip
            write_report(rep, path)
            ctx.say(f"preflight {phase} T {t}: {rep.verdict()}")

    swept = preflight_phases(cfg, d)
    with ThreadPoolExecutor(max_workers=len(swept)) as pool:
        first_error([pool.submit(sweep, p) for p in swept])


def c2data(ctx: Context) -> None:
    from trainer.evaluation.generation import GenerationConfig
    from trainer.loop.c2_precompute import write_c2_data

    cfg, pi1 = ctx.cfg, ctx.sv.serve([ctx.design.partner])[ctx.design.partner]
    # C2's schemas are π1ˢ's greedy Stage-1 answers, generated as an evaluation's are (as the loop's precompute)
    gen = GenerationConfig(
        max_tokens=cfg.eval_max_tokens, concurrency=cfg.eval_concurrency, timeout_s=cfg.eval_timeout_s
    )
    rep = write_c2_data(
        cfg.golden, ctx.wd.data, pi1, gen, on_invalid="skip", limit=cfg.limit, train_sample=cfg.c2_train_sample,
        train_sources=cfg.rl_sources, max_truncated_share=cfg.eval_max_truncated_share,
    )  # fmt: skip
    ctx.manifest.set("c2data", dataclasses.asdict(rep) | {"schema_model": ctx.output(ctx.design.partner)})


def choose(ctx: Context) -> None:
    """The rollout temperature, the no-headroom stop, and each swept phase's improvable prompts."""
    from trainer.phases.preflight import choose_temperature, filter_improvable, read_sweep, write_report

    cfg, wd = ctx.cfg, ctx.wd
    swept = preflight_phases(cfg, ctx.design)
    choice = choose_temperature(read_sweep(wd.preflight, swept), cfg.min_share)
    write_report(choice, wd.choice)
    ctx.temperature = choice.temperature
    ctx.say(f"rl temperature {choice.temperature}: {choice.reason}")
    ctx.manifest.set("choice", {k: v for k, v in choice.as_dict().items() if k != "sweep"})
    if choice.no_headroom:
        where = f"{', '.join(choice.no_headroom)} (min share {cfg.min_share})"
        if not cfg.force_rl:
            raise ExperimentStopped(f"no headroom: {where}; not running RL (--force-rl runs it)")
        ctx.say(f"no headroom: {where}; going on (--force-rl)")
    for phase in swept:
        report = json.loads(wd.report(phase, choice.temperature).read_text())
        # --rl-sources: the arms train on those sources only, improvable set or not
        ids = [i for i in report.get("improvable_ids") or () if not cfg.rl_sources or source_of(i) in cfg.rl_sources]
        if not ids:  # only with --force-rl: nothing to filter, the arm trains on its train split (or source set)
            wd.improvable(phase).unlink(missing_ok=True)
            where = f" of {','.join(cfg.rl_sources)}" if cfg.rl_sources else ""
            ctx.say(f"{phase}: no improvable prompt{where} at T {choice.temperature}; no improvable set")
            continue
        report["improvable_ids"] = ids
        res = filter_improvable(report, wd.data / phase / "train.parquet", wd.improvable(phase), cfg.min_source_share)
        dropped = f"; sources dropped: {res.dropped_sources}" if res.dropped_sources else ""
        ctx.say(f"{phase}: {res.kept} improvable prompts -> {wd.improvable(phase)}{dropped}")


def control(ctx: Context) -> None:
    prompts = ctx.wd.improvable(ctx.design.arms[0])
    if not prompts.is_file():
        raise ExperimentStopped(f"positive control: no improvable prompt set {prompts} (--control off skips it)")
    run, ccfg = ctx.control_phase(ctx.sv.reward_api("local"), ctx.need_temperature())
    _res, verdict = ctx.control_runner(run, ctx.wd.improvable(ctx.design.arms[0]), ccfg)
    ctx.say(verdict.reason)


def rl(ctx: Context) -> None:
    t = ctx.need_temperature()
    if ctx.cfg.rl_sources:  # each arm's train split of those sources (C2's: the π1ˢ schemas c2data wrote)
        from trainer.phases.train_set import write_source_set

        for arm in ctx.design.arms:
            out = ctx.wd.source_set(arm, ctx.cfg.rl_sources)
            if not phase_ok(ctx.wd.phase(arm)) and not out.is_file():
                record = write_source_set(ctx.wd.data / arm / "train.parquet", ctx.cfg.rl_sources, out)
                ctx.manifest.set(f"train_set:{arm}", record)
    train_mixes(ctx)
    jobs = []
    for i, arm in enumerate(ctx.design.arms):
        if phase_ok(ctx.wd.phase(arm)) and ctx.reusable(ctx.arm_phase(i, "", t)):
            continue
        jobs.append((arm, ctx.arm_phase(i, ctx.sv.reward_api(reward_api_of(arm)), t, say=True)))
    ctx.run_phases(jobs, stagger_s=ctx.cfg.rl_stagger_s if ctx.placement.shared_gpu else 0.0)
    ctx.manifest.set("arms", {a: ctx.output(a) for a in ctx.design.arms})


def train_mixes(ctx: Context) -> None:
    """``--rl-mix-share``: each mixed arm's chosen set with the other sources' share, written before the arms
    start; a set already written is reused only for the same share, seed and chosen set (else refused, also
    at share 0 and for a finished arm, so a rerun never reports a mix it did not ask for)."""
    from trainer.experiment.runs import chosen_path
    from trainer.phases.registry import get_phase
    from trainer.phases.train_mix import TrainMixError, check_reuse, mixed_set_path, mixes, write_mixed_set

    share = ctx.cfg.rl_mix_share
    for arm in ctx.design.arms:
        chosen = chosen_path(ctx.chosen_set(arm)[0])
        mixed = mixes(get_phase(arm).built_from_golden, share)
        if chosen is None:
            if mixed and not phase_ok(ctx.wd.phase(arm)):
                raise TrainMixError(
                    f"--rl-mix-share: {share}: {arm} trains on its whole train split (no improvable set fills a "
                    "batch and no --rl-sources): no other source to draw from"
                )
            continue
        out = mixed_set_path(ctx.wd.train_sets, chosen)
        record = check_reuse(out, chosen, share)
        if mixed and record is None and not phase_ok(ctx.wd.phase(arm)):
            record = write_mixed_set(chosen, ctx.wd.data / arm / "train.parquet", share, out)
        if mixed and record is not None:
            ctx.manifest.set(f"train_mix:{arm}", record)


def evaluate(ctx: Context) -> None:
    """Phase D's settings at once on the kept executors (:func:`trainer.runs.phase_d.score_settings`), then scored
    together (paired tests). Each π1 runs Stage 1 once: settings that share a π1 share its schemas (pi2-ab: π1ˢ for
    all three, so their comparison is π2's alone). Scored and written before Phase D ends, so a run cut off during
    Phase D keeps them: pi2-ab's π2 on gold schemas (sft, local, pipe; the B2 target), pi1-ab's π1 schemas alone
    (the B1 target)."""
    from shared import read_golden
    from trainer.evaluation.generation import GenerationClient, GenerationConfig, truncated
    from trainer.evaluation.inference import infer
    from trainer.evaluation.phase_d import load_predictions, write_outputs
    from trainer.evaluation.stage1_cache import stage1_key
    from trainer.evaluation.two_stage import PromptStage, ServeModel, generate_quietly
    from trainer.runs.phase_d import score_settings
    from trainer.serving.identity import fingerprint

    cfg, d, wd = ctx.cfg, ctx.design, ctx.wd
    settings = d.settings()  # setting -> (π1 phase, π2 phase)
    eps = ctx.sv.serve([p for pair in settings.values() for p in pair])
    gen = GenerationConfig(
        max_tokens=cfg.eval_max_tokens, concurrency=cfg.eval_concurrency, timeout_s=cfg.eval_timeout_s
    )
    examples = read_golden(cfg.golden / "common_test_schemas.jsonl", cfg.eval_limit)
    # answers cut at max tokens: counted per setting, and past the share the evaluation fails; the client's
    # concurrency is recorded with each setting's serving mode
    cut: dict[str, Any] = {
        "max_tokens": cfg.eval_max_tokens,
        "max_truncated_share": cfg.eval_max_truncated_share,
        "concurrency": cfg.eval_concurrency,
    }
    # π1 and π2 of a setting come from one pool, served alike: π1's executor's mode is the setting's
    modes = {name: eps[p1].mode for name, (p1, _p2) in settings.items()}
    test_file = cfg.golden / "common_test_schemas.jsonl"

    def serve(name: str) -> ServeModel:
        """The kept executors of the setting's phases (each model is its phase's output, its ``hf_dir``)."""
        p1, p2 = settings[name]

        def served(model: str, stage: PromptStage) -> contextlib.AbstractContextManager[Endpoint]:
            return contextlib.nullcontext(eps[p1 if stage == "stage1" else p2])  # serves ``model``: its phase's output

        return served

    def keep(names: Sequence[str], pi1: str) -> tuple[Path, dict[str, Any]]:
        """π1's schemas, one file per π1 phase, under what they depend on: a rerun after a cut-short eval does
        not redo them."""
        p1 = settings[names[0]][0]
        mode = eps[p1].mode
        key = stage1_key(fingerprint(pi1), test_file, cfg.eval_limit, gen, mode.as_dict() if mode else None)
        return wd.stage1_cache / f"{p1}.json", key

    def stage1_eval(schemas: Mapping[str, Sequence[str]]) -> None:
        """π1's schemas alone, scored as soon as every Stage 1 has ended."""
        preds = {
            name: [{"id": ex.id, "schema_prediction": s, "schema_truncated": truncated(s)}
                   for ex, s in zip(examples, schemas[name], strict=True)]
            for name in settings
        }  # fmt: skip
        out = write_outputs(
            wd.stage1_eval, examples, preds, f"π1 schemas alone ({d.name})", write_predictions=False,
            serving=modes, **cut,
        )  # fmt: skip
        ctx.say(f"π1 schemas alone: {out.report}")

    models = {name: (ctx.output(p1), ctx.output(p2)) for name, (p1, p2) in settings.items()}
    gold = {name: pair[1] for name, pair in settings.items()} if d.gold_schema_eval else {}  # π2 on gold schemas
    with ThreadPoolExecutor(max_workers=len(gold) + 1) as pool:
        phase_d = pool.submit(
            score_settings, models, examples, gen, serve, keep, together=True, say=ctx.say,
            on_stage1=stage1_eval if d.stage1_eval else None,
        )  # fmt: skip
        on_gold = [
            pool.submit(
                infer,
                "stage2",
                examples,
                GenerationClient(eps[p].url, eps[p].served_name, gen),
                wd.gold_schema / f"{name}.jsonl",
                generate_quietly,  # side by side: no interleaved bars
            )
            for name, p in gold.items()
        ]
        first_error(on_gold)
        if gold:  # scored before Phase D's two stages end: a run cut off during them still has it
            gold_preds = {name: load_predictions(wd.gold_schema / f"{name}.jsonl") for name in gold}
            out = write_outputs(
                wd.gold_schema_eval, examples, gold_preds, f"π2 on gold schemas ({d.name})", write_predictions=False,
                serving={name: eps[p].mode for name, p in gold.items()}, **cut,
            )  # fmt: skip
            ctx.say(f"π2 on gold schemas: {out.report}")
        first_error([phase_d])
    res = write_outputs(
        wd.phase_d, examples, phase_d.result(), f"Phase D ({d.name})", serving=modes, **cut,
    )  # fmt: skip
    ctx.say(f"Phase D: {res.report} ({res.decision.get('reason', '')})")


WORKS: dict[str, Callable[[Context], None]] = {
    "sft": sft, "preflight": preflight, "c2data": c2data, "choose": choose, "control": control, "rl": rl,
    "eval": evaluate,
}  # fmt: skip

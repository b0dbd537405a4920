"""``python -m trainer``: data builders, inference, evaluation, the RFT baseline and the demo; it mounts the
phase commands (``trainer/phases/cli.py``), the recipes' (``trainer/run_cli.py``: ``loop``, ``experiment``) and
``serve`` (``trainer/serving/cli.py``: executors that outlive the
command, for GPU nodes).

``data``, ``evaluate`` and ``serve`` are Typer sub-apps; the phase and loop commands join as top-level commands
through their modules' ``register``, and ``experiment`` as a sub-app.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from shared import GoldenExample, read_golden
from shared.golden import EmptySplitError, GoldenFormatError
from shared.split_overlap import SplitOverlapError
from trainer.config_cli import field_option
from trainer.data.datasets import build_datasets
from trainer.data.precompute import precompute_c2
from trainer.data.prompt_fit import PhaseLengths, Stage2Fit
from trainer.data.sft_mix import SourceMix, SourceMixError
from trainer.demo.settings import DEMO_MAX_TOKENS, RlSettings, SftSettings
from trainer.evaluation import report
from trainer.evaluation.answer_log import AnswerLog, OutputNotWritable, check_writable, need_bytes
from trainer.evaluation.generation import (
    GenerationClient,
    GenerationConfig,
    GenerationFailed,
    GenerationSettings,
    RefusedAnswersError,
    TruncatedAnswersError,
)
from trainer.evaluation.inference import infer, schema_predictor
from trainer.evaluation.phase_d import (
    DEFAULT_DECISION_METRIC,
    DEFAULT_MAX_REFUSED_SHARE,
    DEFAULT_MAX_TRUNCATED_SHARE,
    EvalOutputs,
    Setting,
    answer_log_path,
    load_predictions,
    parse_named_path,
    pipeline_key,
    run_pipeline,
    write_outputs,
)
from trainer.phases.cli import ProfileOpt, bad_param, no_token
from trainer.phases.cli import register as register_phases
from trainer.phases.launch import PhaseRun, Profile, check_profile, run_phase
from trainer.registry.phases import BUILD_PHASES, REWARD_KINDS, RewardKind, get_phase, sft_phase_for
from trainer.run_cli import register as register_runs
from trainer.serving.cli import app as serve_app
from trainer.serving.shutdown import exit_on_sigterm

if TYPE_CHECKING:
    from trainer.rft import RftConfig

console = Console()

app = typer.Typer(help="Schema→table RL trainer: data, inference, evaluation.", no_args_is_help=True)
data_app = typer.Typer(help="Build training data (parquet) from golden JSONL.", no_args_is_help=True)
evaluate_app = typer.Typer(help="Phase-D evaluation: run or score the pipeline per setting.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(evaluate_app, name="evaluate")
app.add_typer(serve_app, name="serve")
register_phases(app)  # run / preflight* / positive-control / export as top-level commands
register_runs(app)  # loop (pack, unpack), experiment pi1-ab | pi2-ab


def _bad(param: str, msg: str) -> typer.BadParameter:
    return typer.BadParameter(msg, param_hint=param)


def _gen(max_tokens: int, concurrency: int, timeout: float, seed: int) -> GenerationConfig:
    return GenerationSettings(max_tokens=max_tokens, concurrency=concurrency, timeout_s=timeout).config(seed=seed)


# The generation options of infer, precompute-schemas and evaluate pipeline: GenerationSettings' fields, whose
# defaults are the loop's Phase D's.
MaxTokens = field_option(GenerationSettings, "max_tokens")
Concurrency = field_option(GenerationSettings, "concurrency")
Timeout = field_option(GenerationSettings, "timeout_s")
MaxRefusedShare = typer.Option(
    DEFAULT_MAX_REFUSED_SHARE,
    min=0.0,
    max=1.0,
    help="Fail when the executor refuses (HTTP 400, e.g. a prompt over its context) more than this share of a "
    "setting's π1 or π2 prompts.",
)
Seed = typer.Option(0, help="Sampling seed (generation is greedy).")


Stage2Tokenizer = typer.Option(
    None,
    exists=True,
    file_okay=False,
    help="Tokenizer (HF model dir) of the Stage-2 executor: with --stage2-max-len, documents whose Stage-2 "
    "prompt cannot fit are counted and dropped (C1 in build, C2 in precompute-schemas).",
)
Stage2MaxLen = typer.Option(None, min=1, help="The Stage-2 executor's max_model_len (vLLM --max-model-len).")


def _stage2_fit(tokenizer: Path | None, max_len: int | None) -> Stage2Fit | None:
    if (tokenizer is None) != (max_len is None):
        raise _bad("--stage2-tokenizer/--stage2-max-len", "give both or neither")
    return Stage2Fit(tokenizer, max_len) if tokenizer is not None and max_len is not None else None


def _phase_lengths(tokenizer: Path | None, max_prompt_len: int | None, max_sft_len: int | None) -> PhaseLengths | None:
    if tokenizer is None:
        if max_prompt_len is not None or max_sft_len is not None:
            raise _bad("--max-prompt-len/--max-sft-len", "need --tokenizer (the policy's model folder)")
        return None
    try:
        return PhaseLengths(tokenizer, max_prompt_len, max_sft_len)
    except ValueError as exc:
        raise _bad("--tokenizer", str(exc)) from None


_SHOWN_IDS = 20
StrictSplits = typer.Option(
    False,
    "--strict-splits",
    help="Refuse golden data whose splits share a document (same id, or same text once whitespace is collapsed and "
    "case folded). Default: drop the train rows that repeat a validation or test document, named in the manifest.",
)


def _print_too_long(manifest: Path, phases: list[str]) -> None:
    """Per phase and split: the rows over its length limit, the limit and their first ids."""
    built = json.loads(manifest.read_text())["phases"]
    for phase in phases:
        found = built.get(phase, {}).get("too_long")
        if not found:
            continue
        for split, over in found["over"].items():
            ids = found["ids"][split]
            shown = ", ".join(ids[:_SHOWN_IDS]) + (" ..." if len(ids) > _SHOWN_IDS else "")
            console.print(
                f"{phase} {split}: {over} of {found['rows'][split]} rows over {found['limit_key']} {found['limit']} "
                f"tokens (longest {found['longest'][split]})" + (f": {shown}" if ids else "")
            )
    console.print(
        "Rows over a limit are kept in the data: the phase's length filter drops them at its start and names "
        "them in its phase_result.json (all ids: manifest.json, <phase>.too_long)."
    )


@data_app.command("build")
def data_build(
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Folder with common_{split}_schemas.jsonl."),
    out: Path = typer.Option(..., help="Output folder: <phase>/<split>.parquet + manifest.json."),
    phases: str = typer.Option(",".join(BUILD_PHASES), help=f"Comma-separated phases ({','.join(BUILD_PHASES)})."),
    limit: int | None = typer.Option(None, min=1, help="First N examples per split."),
    stage2_tokenizer: Path | None = Stage2Tokenizer,
    stage2_max_len: int | None = Stage2MaxLen,
    sft_mix: str | None = typer.Option(
        None,
        help="SFT train split reweighted by source, SOURCE=WEIGHT,... (wikitabletext=2,rotowire_sent=0.5): floor(w) "
        "copies of each example plus a seeded share frac(w); unnamed sources keep 1; validation is never mixed.",
    ),
    sft_mix_seed: int = typer.Option(0, help="Seed of the fractional part of --sft-mix."),
    tokenizer: Path | None = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="The policy's tokenizer (HF model dir): with --max-prompt-len / --max-sft-len, the rows over a "
        "phase's length limit are counted and named (printed, manifest <phase>.too_long), not dropped.",
    ),
    max_prompt_len: int | None = typer.Option(
        None, min=1, help="RL phases' data.max_prompt_length (512 gpu, 384 cpu-smoke): prompts over it are reported."
    ),
    max_sft_len: int | None = typer.Option(
        None, min=1, help="SFT phases' data.max_length (1024 gpu, 768 cpu-smoke): conversations over it are reported."
    ),
    strict_splits: bool = StrictSplits,
) -> None:
    """SFT (A1, A2) and RL (B1, B2, C1) parquet files, plus the manifest. Every split file must hold examples; the
    train rows that repeat a validation or test document (same id, or same text once whitespace is collapsed and
    case folded) are dropped and named in the manifest (split_overlap), or refused with --strict-splits."""
    selected = [p.strip().lower() for p in phases.split(",") if p.strip()]
    unknown = [p for p in selected if p not in BUILD_PHASES]
    if unknown:
        raise _bad("--phases", f"unknown {unknown}; choose from {list(BUILD_PHASES)} (c2: precompute-schemas)")
    fit = _stage2_fit(stage2_tokenizer, stage2_max_len)
    lengths = _phase_lengths(tokenizer, max_prompt_len, max_sft_len)
    try:
        mix = SourceMix.parse(sft_mix, sft_mix_seed) if sft_mix is not None else None
        with console.status("building datasets"):
            counts = build_datasets(golden, out, selected, limit=limit, stage2_fit=fit, sft_mix=mix, lengths=lengths,
                                    strict_splits=strict_splits)  # fmt: skip
    except (SplitOverlapError, EmptySplitError) as exc:  # one line naming the ids or the file
        typer.echo(f"error: --golden: {exc}", err=True)
        raise typer.Exit(1) from None
    except SourceMixError as exc:
        raise _bad("--sft-mix", str(exc).removeprefix("--sft-mix: ")) from None
    except (GoldenFormatError, FileNotFoundError) as exc:  # file:line: field: reason, or a missing split file
        raise _bad("--golden", str(exc)) from None
    _print_build(out, selected, counts, fit, mix, lengths)


def _print_build(
    out: Path,
    selected: list[str],
    counts: dict[str, dict[str, int]],
    fit: Stage2Fit | None,
    mix: SourceMix | None,
    lengths: PhaseLengths | None,
) -> None:
    """What ``data build`` wrote, read back from its manifest: the rows dropped, the counts, the mix, the rows over
    a length limit."""
    if fit is not None:
        dropped = json.loads((out / "manifest.json").read_text())["phases"].get("c1", {}).get("stage2_too_long", {})
        console.print(f"C1: dropped documents whose Stage-2 prompt does not fit {fit.max_model_len} tokens: {dropped}")
    overlap = json.loads((out / "manifest.json").read_text()).get("split_overlap")
    if overlap and overlap["dropped_train"]["count"]:
        dropped = overlap["dropped_train"]
        console.print(
            f"dropped {dropped['count']} train rows that repeat a validation or test document: "
            f"{', '.join(dropped['ids'][:_SHOWN_IDS])}{' ...' if dropped['count'] > _SHOWN_IDS else ''} "
            "(all: manifest.json, split_overlap)", soft_wrap=True, highlight=False,
        )  # fmt: skip
    table = Table("phase", "train", "validation")
    for phase, c in counts.items():
        table.add_row(phase, str(c.get("train", 0)), str(c.get("validation", 0)))
    console.print(table)
    if mix is not None:
        mixed = json.loads((out / "manifest.json").read_text())["phases"]
        described = next((mixed[p]["sft_mix"] for p in selected if mixed.get(p, {}).get("sft_mix")), None)
        if described:
            console.print(
                f"SFT mix {mix.spec()}: train examples per source {described['train_before']} -> "
                f"{described['train_after']}"
            )
    if lengths is not None:
        _print_too_long(out / "manifest.json", selected)
    console.print(f"manifest: {out / 'manifest.json'}")


@data_app.command("precompute-schemas")
def data_precompute(
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Golden folder."),
    out: Path = typer.Option(..., help="Output folder (writes c2/<split>.parquet, updates manifest.json)."),
    executor_url: str = typer.Option(..., help="π1 executor base URL (OpenAI-compatible)."),
    model: str = typer.Option(..., help="Served model name of π1."),
    on_invalid: str = typer.Option("skip", help="Invalid predicted schema: 'skip' the row or use the 'gold' schema."),
    limit: int | None = typer.Option(None, min=1, help="First N examples per split."),
    train_sample: int | None = typer.Option(
        None, min=1, help="A seeded random N train documents (VERL draws data.train_max_samples of them)."
    ),
    max_tokens: int = MaxTokens,
    max_truncated_share: float = typer.Option(
        DEFAULT_MAX_TRUNCATED_SHARE, min=0.0, max=1.0, help="Fail past this share of π1 schemas cut at --max-tokens."
    ),
    concurrency: int = Concurrency,
    timeout: float = Timeout,
    seed: int = Seed,
    stage2_tokenizer: Path | None = Stage2Tokenizer,
    stage2_max_len: int | None = Stage2MaxLen,
) -> None:
    """C2 data: π1's predicted schemas → Stage-2 prompts; ground truth = gold table."""
    if on_invalid not in ("skip", "gold"):
        raise _bad("--on-invalid", f"must be 'skip' or 'gold', got {on_invalid!r}")
    policy: Literal["skip", "gold"] = "skip" if on_invalid == "skip" else "gold"
    fit = _stage2_fit(stage2_tokenizer, stage2_max_len)
    client = GenerationClient(executor_url, model, _gen(max_tokens, concurrency, timeout, seed))
    sample = {"train": train_sample} if train_sample else None
    try:
        report = precompute_c2(
            golden,
            out,
            schema_predictor(client),
            client.model,
            on_invalid=policy,
            limit=limit,
            stage2_fit=fit,
            sample=sample,
            seed=seed,
            max_truncated_share=max_truncated_share,
        )
    except TruncatedAnswersError as exc:
        raise _bad("--max-tokens", str(exc)) from None
    table = Table(
        "split", "rows written", "invalid schemas", f"invalid → {on_invalid}", f"cut at {max_tokens} tokens",
        "Stage-2 too long (dropped)",
    )  # fmt: skip
    for split, n in report.counts.items():
        table.add_row(
            split,
            str(n),
            str(report.invalid[split]),
            ", ".join(report.invalid_ids[split][:3]),
            str(len(report.truncated_ids.get(split, []))),
            str(len(report.too_long_ids.get(split, []))),
        )
    console.print(table)


@app.command("infer")
def infer_cmd(
    stage: str = typer.Argument(..., help="stage1 (π1: document → schema) or stage2 (π2: gold schema → table)."),
    executor_url: str = typer.Option(..., help="Executor base URL."),
    model: str = typer.Option(..., help="Served model name."),
    golden: Path = typer.Option(..., exists=True, dir_okay=False, help="A golden JSONL file."),
    out: Path = typer.Option(..., help="Output JSONL of predictions."),
    limit: int | None = typer.Option(None, min=1, help="First N examples."),
    max_tokens: int = MaxTokens,
    concurrency: int = Concurrency,
    timeout: float = Timeout,
    seed: int = Seed,
) -> None:
    """Predictions: id, stage, prediction, messages_sha256, model, prompt_version."""
    if stage not in ("stage1", "stage2"):
        raise _bad("STAGE", f"must be stage1 or stage2, got {stage!r}")
    client = GenerationClient(executor_url, model, _gen(max_tokens, concurrency, timeout, seed))
    records = infer("stage1" if stage == "stage1" else "stage2", read_golden(golden, limit), client, out)
    console.print(f"{len(records)} predictions → {out}")


def print_summary(res: EvalOutputs) -> None:
    report.print_summary(console, res.metrics, res.decision, res.report, res.metrics_path)


DecisionMetric = typer.Option(DEFAULT_DECISION_METRIC, help="Overall metric the loop-2 decision compares.")
MinGain = typer.Option(1.0, help="Stop when the last setting gains fewer points (×100) than this.")


@evaluate_app.command("pipeline")
def evaluate_pipeline(
    golden: Path = typer.Option(..., exists=True, dir_okay=False, help="Golden JSONL (usually the test split)."),
    setting: list[str] = typer.Option(..., help="NAME=π1URL,π1MODEL,π2URL,π2MODEL (repeat; order matters)."),
    out: Path = typer.Option(Path("eval_out"), help="Output folder."),
    limit: int | None = typer.Option(None, min=1, help="First N examples."),
    decision_metric: str = DecisionMetric,
    min_gain: float = MinGain,
    max_tokens: int = MaxTokens,
    max_truncated_share: float = typer.Option(
        DEFAULT_MAX_TRUNCATED_SHARE,
        min=0.0,
        max=1.0,
        help="Fail when more than this share of a setting's π1 schemas or π2 tables stop at --max-tokens.",
    ),
    max_refused_share: float = MaxRefusedShare,
    concurrency: int = Concurrency,
    timeout: float = Timeout,
    seed: int = Seed,
) -> None:
    """Stage 1 then Stage 2 per setting; metrics, report, plots and the loop-2 decision. The servers at the
    URLs were started elsewhere: their serving mode is recorded as unknown, beside the concurrency and max
    tokens used here. Each answer is kept as it comes (``predictions_NAME.partial.jsonl``, its key beside it):
    the same command run again continues from them; other models or generation settings start over."""
    try:
        settings = [Setting.parse(s) for s in setting]
    except ValueError as exc:
        raise _bad("--setting", str(exc)) from None
    if len({s.name for s in settings}) != len(settings):
        raise _bad("--setting", "setting names must be unique")
    examples = read_golden(golden, limit)
    if not examples:
        raise _bad("--golden", f"{golden}: no examples to evaluate (an empty split)")
    try:  # before any request: a folder that cannot take the outputs is found now, not after the generation
        check_writable(out, need_bytes(len(examples), len(settings), max_tokens))
    except OutputNotWritable as exc:
        raise _bad("--out", str(exc)) from None
    gen = _gen(max_tokens, concurrency, timeout, seed)
    preds = {s.name: _run_setting(s, examples, gen, out) for s in settings}
    try:
        res = write_outputs(
            out, examples, preds, f"Pipeline evaluation: {golden.name}", decision_metric, min_gain,
            max_tokens=max_tokens, max_truncated_share=max_truncated_share, concurrency=concurrency,
            max_refused_share=max_refused_share,
        )  # fmt: skip
    except TruncatedAnswersError as exc:
        raise _bad("--max-tokens", f"{exc} (the report is in {out})") from None
    except RefusedAnswersError as exc:
        raise _bad("--max-refused-share", f"{exc} (the report is in {out})") from None
    print_summary(res)


def _run_setting(
    s: Setting, examples: Sequence[GoldenExample], gen: GenerationConfig, out: Path
) -> list[dict[str, Any]]:
    """One setting's pipeline, continuing from the answers its log kept; a failed generation exits, the log kept."""
    log = AnswerLog.open(answer_log_path(out, s.name), pipeline_key(s, gen))
    if log.changed:
        console.print(f"setting {s.name!r}: the answers in {log.path} were generated otherwise, starting over: "
                      + "; ".join(log.changed), soft_wrap=True)  # fmt: skip
    elif len(log):
        console.print(f"setting {s.name!r}: {len(log)} answers kept from an earlier run ({log.path})")
    try:
        return run_pipeline(s, examples, gen, log)
    except (GenerationFailed, OutputNotWritable) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
        console.print(f"{len(log)} answers of setting {s.name!r} are kept in {log.path}: the same command "
                      "continues from them", soft_wrap=True, highlight=False)  # fmt: skip
        raise typer.Exit(1) from None


@evaluate_app.command("score")
def evaluate_score(
    golden: Path = typer.Option(..., exists=True, dir_okay=False, help="Golden JSONL."),
    predictions: list[str] = typer.Option(..., help="NAME=FILE (repeat): pipeline or `trainer infer` JSONL."),
    out: Path = typer.Option(Path("eval_out"), help="Output folder."),
    decision_metric: str = DecisionMetric,
    min_gain: float = MinGain,
    max_truncated_share: float = typer.Option(
        DEFAULT_MAX_TRUNCATED_SHARE, min=0.0, max=1.0, help="Fail past this share of answers cut at the token limit."
    ),
    max_refused_share: float = MaxRefusedShare,
) -> None:
    """Score existing prediction files offline (no model) with the same metrics and report. Records of
    ``trainer infer`` and of ``evaluate pipeline`` say which answers stopped at the token limit."""
    try:
        named = [parse_named_path(p) for p in predictions]
        preds = {name: load_predictions(path) for name, path in named}
        res = write_outputs(
            out, read_golden(golden), preds, f"Offline scoring: {golden.name}", decision_metric, min_gain, False,
            max_truncated_share=max_truncated_share, max_refused_share=max_refused_share,
        )  # fmt: skip
    except (TruncatedAnswersError, RefusedAnswersError) as exc:
        raise _bad("--predictions", f"{exc} (the report is in {out})") from None
    except (ValueError, FileNotFoundError) as exc:
        raise _bad("--predictions", str(exc)) from None
    print_summary(res)


@app.command("rft", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def rft_cmd(
    ctx: typer.Context,
    golden: Path = typer.Option(..., exists=True, file_okay=False, help="Golden folder."),
    reward: str = typer.Option(
        "schema", "--reward", "--stage", help="schema | pipeline (π1, trains as A1) or table (π2, trains as A2)."
    ),
    policy_url: str = typer.Option(..., help="Executor serving the policy to sample from."),
    policy_model: str = typer.Option(..., help="Served model name of the policy."),
    start_model: str | None = typer.Option(
        None, help="HF dir fine-tuned on the kept samples (default: skip training)."
    ),
    reward_url: str = typer.Option(..., help="Reward API URL."),
    out: Path = typer.Option(Path("runs/rft"), help="Output folder."),
    k: int = typer.Option(4, min=1, help="Samples per prompt."),
    threshold: float = typer.Option(0.5, help="Keep the best sample only if its reward ≥ this."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    max_tokens: int = field_option(
        GenerationSettings,
        "max_tokens",
        "max_tokens per sample: the evaluation answer's budget (shared.EVAL_ANSWER_MAX_TOKENS), as in the loop.",
    ),
    limit: int | None = typer.Option(None, min=1, help="First N training examples."),
    per_source: str | None = typer.Option(
        None,
        help="Prompts per source, SOURCE=N,... (e.g. wikitabletext=2000,e2e=500), drawn with --seed; "
        "sources left out are not sampled (default: every training example).",
    ),
    concurrency: int = field_option(
        GenerationSettings, "concurrency", "Concurrent requests per executor (each asks for k samples)."
    ),
    timeout: float = Timeout,
    seed: int = typer.Option(0, help="Seed of the sampling (prompt i gets seed + i) and of --per-source."),
    beat_greedy: bool = typer.Option(
        False, help="Keep a prompt's best sample only if its reward beats the policy's greedy answer's."
    ),
    with_gold: bool = typer.Option(False, help="Add the gold SFT row of every drawn prompt to the kept samples."),
    profile: str = ProfileOpt,
) -> None:
    """Sample k, score via reward_api, keep the best ≥ threshold, write SFT parquet, train with the SFT launcher."""
    from trainer.rft import RftConfig

    overrides = no_token(ctx.args, "trainer rft")
    if reward not in REWARD_KINDS:
        raise typer.BadParameter(f"must be one of {list(REWARD_KINDS)}, got {reward!r}", param_hint="--reward")
    counts = _per_source_counts(per_source)
    try:
        cfg = RftConfig(k=k, threshold=threshold, temperature=temperature, max_tokens=max_tokens,
                        concurrency=concurrency, timeout_s=timeout, seed=seed, beat_greedy=beat_greedy,
                        with_gold=with_gold)  # fmt: skip
        prof = check_profile(profile)
    except ValueError as exc:
        raise bad_param("--k/--threshold/--profile", exc) from None
    _build_rft(golden, out, reward, policy_url, policy_model, reward_url, cfg, limit, counts)
    if start_model:
        _train_rft(reward, prof, out, start_model, overrides)


def _per_source_counts(per_source: str | None) -> dict[str, int] | None:
    """``rft --per-source``, parsed (none: every training example)."""
    from trainer.rft import parse_per_source

    try:
        return parse_per_source(per_source) if per_source else None
    except ValueError as exc:
        raise bad_param("--per-source", exc) from None


def _build_rft(
    golden: Path,
    out: Path,
    reward: RewardKind,
    policy_url: str,
    policy_model: str,
    reward_url: str,
    cfg: RftConfig,
    limit: int | None,
    counts: dict[str, int] | None,
) -> None:
    """The kept samples' SFT data (:func:`trainer.rft.build_rft_data`), and a table of what was kept."""
    from trainer.rft import build_rft_data

    try:
        rep = build_rft_data(golden, out, reward, policy_url, policy_model, reward_url, cfg, limit, counts)
    except ValueError as exc:
        if "per-source" not in str(exc):
            raise
        raise bad_param("--per-source", exc) from None
    table = Table("reward", "prompts", "samples", "kept", "mean best reward")
    table.add_row(rep.reward, str(rep.prompts), str(rep.samples), str(rep.kept), f"{rep.mean_best_reward:.3f}")
    console.print(table)


def _train_rft(reward: RewardKind, profile: Profile, out: Path, start_model: str, overrides: tuple[str, ...]) -> None:
    """The SFT phase of ``reward``'s policy on the kept samples (``out/data``), from ``start_model``."""
    run = PhaseRun(
        phase=get_phase(sft_phase_for(reward)),
        profile=profile,
        data_dir=out / "data",
        out_dir=out / "sft",
        model_path=start_model,
        overrides=overrides,
    )
    res = run_phase(run)
    console.print(
        f"RFT model: {res.hf_dir} (status {res.status}); compare: trainer evaluate pipeline --setting rft=..."
    )
    if res.status != "ok":
        raise typer.Exit(res.exit_code or 1)


@app.command("demo")
def demo_cmd(
    retrain: bool = typer.Option(False, "--retrain", help="Train A1, A2 and C1 again even if matching models exist."),
    out: Path = typer.Option(Path("demo_out"), help="Output folder (models under OUT/runs are reused)."),
    sample: Path | None = typer.Option(None, help="Golden folder (default: the bundled E2E sample)."),
    eval_limit: int | None = typer.Option(None, min=1, help="First N held-out documents (default: all)."),
    max_tokens: int = typer.Option(
        DEMO_MAX_TOKENS, min=1, help="max_tokens of every generation (the demo's CPU-sized override)."
    ),
    sft_steps: int = typer.Option(SftSettings.steps, min=1, help="Optimizer steps of each of A1 and A2."),
    sft_batch: int = typer.Option(SftSettings.batch, min=1, help="Examples per SFT step."),
    sft_lr: float = typer.Option(SftSettings.lr, help="SFT learning rate."),
    rl_steps: int = typer.Option(RlSettings.steps, min=1, help="GRPO steps of C1."),
    rl_prompts: int = typer.Option(RlSettings.prompts, min=1, help="C1: training prompts per step."),
    rl_samples: int = typer.Option(RlSettings.samples, min=2, help="C1: samples per prompt (the GRPO group)."),
    rl_lr: float = typer.Option(RlSettings.lr, help="C1: actor learning rate."),
    base_model: str | None = typer.Option(None, help="Base model HF dir (default: SmolLM2-135M-Instruct)."),
) -> None:
    """README's main job: base → a brief A1/A2 SFT → a short C1 GRPO phase on the pipeline reward, end to end on
    the bundled E2E sample, on CPU."""
    from trainer.demo.runner import run_demo
    from trainer.demo.settings import DemoSettings

    settings = DemoSettings(
        out=out,
        eval_limit=eval_limit,
        max_tokens=max_tokens,
        base_model=base_model,
        sft=SftSettings(steps=sft_steps, batch=sft_batch, lr=sft_lr),
        rl=RlSettings(steps=rl_steps, prompts=rl_prompts, samples=rl_samples, lr=rl_lr),
        retrain=retrain,
        **({"sample": sample} if sample is not None else {}),
    )
    run_demo(settings, console=console)


def main() -> None:
    exit_on_sigterm()  # a SIGTERM (Slurm, Kubernetes) stops every server we started, as Ctrl-C does
    app()

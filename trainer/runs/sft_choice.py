"""``trainer experiment sft-choice``: SFT recipes compared on validation and on a leave-one-source-out check, before
the loop trains from one of them.

A recipe that gains on one source by trading the others away looks fine on the sources it trained on; it shows when
the recipe is trained without a source and scored on it. For every candidate (a name, a source mix of A1/A2's train
split and its own SFT overrides, :class:`~trainer.runs.config.Candidate`; the run's ``--sft-override`` apply to all):

- **validation**: A1 and A2 on the candidate's train split, then Phase D end to end (π1 writes the schema, π2 the
  table on it) on the validation split, every source;
- **held out**: for each source of ``--held-out`` (default: every source of the train split), A1 and A2 on the train
  split without it (its weight 0 in the candidate's mix), then Phase D on that source's validation documents only.

The candidates are paired-tested on the same documents (aligned cell F1, 95% bootstrap intervals): on validation
(the macro over sources and each source) and held out (each held-out source and their macro). **The choice**
(:func:`choose`): the best candidate on the validation macro, unless on some held-out source it is worse than another
candidate beyond the interval (the paired interval's upper end below 0); then the best on validation among those that
are not, and where every candidate is, the best on the held-out macro. Every number, the rule's verdicts and the
choice go to the run record (``run.json``, ``report.md``). The test split is never read.

Resumable as every recipe: a phase by :mod:`trainer.runs.reuse`, a Phase D by its content key.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.golden import golden_filename, iter_golden, source_of
from trainer.evaluation.inference import read_jsonl
from trainer.evaluation.phase_d import DEFAULT_PAIRED_METRIC, aggregate
from trainer.phases.launch import PhaseRunner, run_phase
from trainer.runs import phase_d_part
from trainer.runs.config import Candidate, SftChoiceConfig
from trainer.runs.context import RunContext
from trainer.runs.phase_d_part import EvalSet

RECIPE = "sft-choice"
METRIC = DEFAULT_PAIRED_METRIC  # aligned cell F1, end to end
WHOLE = "all"  # the slot of the runs trained on every source


class HeldOutError(ValueError):
    """``--held-out`` names a source the train split does not hold."""


def slot_name(held_out: str | None) -> str:
    return f"without_{held_out}" if held_out else WHOLE


def read_rows(eval_dir: Path, setting: str) -> list[dict[str, Any]]:
    """A Phase D's scored documents of one setting (``predictions_<setting>.jsonl``: id, source and the metrics)."""
    return read_jsonl(eval_dir / f"predictions_{setting}.jsonl")


def candidate_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair of candidates, the earlier one the baseline."""
    return list(itertools.combinations(names, 2))


def source_tests(rows: Mapping[str, Sequence[Mapping[str, Any]]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Paired tests of the candidates on one source's documents, labelled with that source."""
    from trainer.evaluation.significance import paired_tests

    found = [t for t in paired_tests(rows, candidate_pairs(names), METRIC) if t["scope"] == "pooled"]
    source = next(iter({str(r.get("source", "")) for rs in rows.values() for r in rs}), "")
    return [{**t, "scope": source} for t in found]


def choose(
    names: Sequence[str], validation_macro: Mapping[str, float | None], held_macro: Mapping[str, float | None],
    held_tests: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The module's rule: the best on validation among the candidates no other beats on a held-out source beyond the
    interval; where every candidate is beaten somewhere, the best on the held-out macro."""
    beaten: dict[str, list[str]] = {n: [] for n in names}
    for t in held_tests:
        if t["scope"] in ("pooled", "macro"):
            continue
        if t["ci_high"] < 0:  # the treatment is worse on this source
            beaten[t["treatment"]].append(f"{t['scope']}: {t['diff']:+.4f} vs {t['baseline']} "
                                          f"[{t['ci_low']:+.4f}, {t['ci_high']:+.4f}]")  # fmt: skip
        if t["ci_low"] > 0:  # the baseline is
            beaten[t["baseline"]].append(f"{t['scope']}: {-t['diff']:+.4f} vs {t['treatment']} "
                                         f"[{-t['ci_high']:+.4f}, {-t['ci_low']:+.4f}]")  # fmt: skip
    fine = [n for n in names if not beaten[n]]
    by, pool = (validation_macro, fine) if fine else (held_macro, list(names))

    def score(name: str) -> float:
        value = by.get(name)
        return float("-inf") if value is None else value

    chosen = max(pool, key=score)
    why = ("the best validation macro among the candidates no other beats on a held-out source" if fine else
           "every candidate is beaten on some held-out source: the best held-out macro")  # fmt: skip
    return {"chosen": chosen, "rule": why, "beaten_on_held_out": beaten}


class SftChoice:
    def __init__(self, cfg: SftChoiceConfig, runner: PhaseRunner = run_phase, say: Callable[[str], None] = print):
        self.cfg = cfg = dataclasses.replace(cfg, out=cfg.folder(RECIPE))
        self.ctx = RunContext(RECIPE, cfg, runner, say)
        self.candidates = cfg.parsed_candidates()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.candidates]

    def train_sources(self) -> list[str]:
        """The sources of the train split (the first ``--limit`` rows, as the data build reads them)."""
        found: dict[str, None] = {}
        for i, ex in enumerate(iter_golden(self.cfg.golden / golden_filename("train"))):
            if self.cfg.limit is not None and i >= self.cfg.limit:
                break
            found.setdefault(source_of(ex.id))
        return list(found)

    def held_out(self) -> list[str]:
        sources = self.train_sources()
        absent = [s for s in self.cfg.held_out if s not in sources]
        if absent:
            raise HeldOutError(f"--held-out: {absent} are not sources of the train split {sources}")
        held = list(self.cfg.held_out) or sources
        if len(held) == len(sources) and len(sources) < 2:
            raise HeldOutError(f"--held-out: the train split holds one source ({sources}): nothing is left to train on")
        return held

    def slots(self) -> list[str | None]:
        return [None, *self.held_out()]

    def folder(self, candidate: Candidate, held_out: str | None) -> Path:
        return self.ctx.root / candidate.name / slot_name(held_out)

    def eval_set(self, held_out: str | None) -> EvalSet:
        return EvalSet("validation", held_out, self.cfg.val_limit, per_source=True)

    def base_model(self) -> str:
        return self.ctx.base_model(self.cfg.dry_run)

    # -- the plan
    def describe(self) -> str:
        """What ``--dry-run`` prints: per slot, each candidate's mix and phases, then its Phase D."""
        lines = [f"sft-choice in {self.ctx.root}: candidates {', '.join(self.names)}; metric {METRIC}"]
        for held in self.slots():
            docs = f"the validation documents of {held}" if held else "the validation split, every source"
            lines.append(f"{slot_name(held)}: trained {'without ' + held if held else 'on every source'}")
            for c in self.candidates:
                mix = c.without(held)
                weights = ",".join(f"{s}={w:g}" for s, w in mix.weights.items()) if mix else "the split as it is"
                own = f", {' '.join(c.overrides)}" if c.overrides else ""
                start = self.base_model()
                lines.append(f"  {c.name}: mix {weights}{own}; a1, a2 from {start} -> {self.folder(c, held)}")
            limit = f" (the first {self.cfg.val_limit} of each source)" if self.cfg.val_limit else ""
            lines.append(f"  Phase D of {', '.join(self.names)} on {docs}{limit} -> {self.eval_dir(held)}")
        return "\n".join(lines)

    def eval_dir(self, held_out: str | None) -> Path:
        return self.ctx.root / f"eval_{slot_name(held_out)}"

    # -- the run
    def run(self) -> dict[str, Any]:
        record = self.ctx.record
        record.set("candidates", {c.name: {"mix": dict(c.mix.weights), "overrides": list(c.overrides)}
                                  for c in self.candidates})  # fmt: skip
        slots = self.slots()
        record.set("held_out", slots[1:])
        with self.ctx.servers:
            for held in slots:  # one slot at a time: its SFT for every candidate, then its Phase D
                with self.ctx.part(f"sft_{slot_name(held)}"):
                    models = {c.name: self.sft(c, held) for c in self.candidates}
                with self.ctx.part(f"eval_{slot_name(held)}"):
                    self.evaluate(held, models)
        record.set("sft_choice", self.summary(slots))
        record.write_report()
        return record.data

    def sft(self, candidate: Candidate, held_out: str | None) -> tuple[str, str]:
        """π1ˢ and π2ˢ of a candidate with ``held_out`` left out of their train split (side by side on GPUs)."""
        from trainer.data.datasets import build_datasets
        from trainer.data.sft_mix import check_reuse

        base, mix = self.folder(candidate, held_out), candidate.without(held_out)
        data = base / "data"
        if all((data / p / "train.parquet").is_file() for p in ("a1", "a2")):
            check_reuse(data, mix)
        else:
            counts = build_datasets(self.cfg.golden, data, ["a1", "a2"], limit=self.cfg.limit, sft_mix=mix,
                                    strict_splits=self.cfg.strict_splits)  # fmt: skip
            self.ctx.record.set(f"data:{candidate.name}/{slot_name(held_out)}", {"dir": str(data), "counts": counts})
        places, together = self.ctx.places(2, sft=True)
        runs = [self.ctx.phase_run(name, self.base_model(), base / name, data_dir=data, placement=p,
                                   settings=candidate.overrides)
                for name, p in zip(("a1", "a2"), places, strict=True)]  # fmt: skip
        pi1, pi2 = self.ctx.run_phases(runs, together=together)
        return pi1, pi2

    def evaluate(self, held_out: str | None, models: Mapping[str, tuple[str, str]]) -> None:
        """Phase D of every candidate on the slot's validation documents; reused for the same key."""
        out, docs, tag = self.eval_dir(held_out), self.eval_set(held_out), f"eval_{slot_name(held_out)}"
        key = phase_d_part.eval_key(self.cfg, models, docs)
        if phase_d_part.eval_key_difference(out, key) is None:
            self.ctx.record.phase_d(tag, out, dict(models), {})
            return
        examples = docs.read(self.cfg.golden)
        spec, waves = phase_d_part.placed(self.ctx, models, tag)
        scored = phase_d_part.score(self.ctx, models, examples, spec, waves=waves, eval_set=docs,
                                    kept_under=slot_name(held_out))  # fmt: skip
        self.ctx.servers.pool.stop_except([])
        title = f"SFT choice: {slot_name(held_out)} ({len(examples)} validation documents)"
        phase_d_part.write(self.ctx, tag, out, models, examples, scored.records, scored.modes, title)
        phase_d_part.record_eval_key(out, key)

    def summary(self, slots: Sequence[str | None]) -> dict[str, Any]:
        """Each candidate's means on validation and held out, the paired tests and the choice (:func:`choose`)."""
        from trainer.evaluation.significance import intervals, paired_tests

        names, held = self.names, [s for s in slots if s]
        validation = {n: read_rows(self.eval_dir(None), n) for n in names}
        held_rows = {h: {n: read_rows(self.eval_dir(h), n) for n in names} for h in held}
        per_candidate = {}
        for n in names:
            means, ci = aggregate(validation[n]), intervals(validation[n], (METRIC,))
            held_means = {h: aggregate(held_rows[h][n])["overall"].get(METRIC) for h in held}
            known = [v for v in held_means.values() if v is not None]
            per_candidate[n] = {
                "validation": {"macro": means["macro"].get(METRIC), "macro_ci95": ci["macro"].get(METRIC),
                               "per_source": {s: m.get(METRIC) for s, m in means["per_source"].items()},
                               "per_source_ci95": {s: v.get(METRIC) for s, v in ci["per_source"].items()}},
                "held_out": {"per_source": held_means,
                             "per_source_ci95": {h: intervals(held_rows[h][n], (METRIC,))["overall"].get(METRIC)
                                                 for h in held},
                             "macro": statistics.fmean(known) if known else None},
            }  # fmt: skip
        tests_validation = paired_tests(validation, candidate_pairs(names), METRIC)
        tests_held = [t for h in held for t in source_tests(held_rows[h], names)]
        if len(held) > 1:
            union = {n: [r for h in held for r in held_rows[h][n]] for n in names}
            tests_held += [t for t in paired_tests(union, candidate_pairs(names), METRIC) if t["scope"] == "macro"]
        verdict = choose(names, {n: per_candidate[n]["validation"]["macro"] for n in names},
                         {n: per_candidate[n]["held_out"]["macro"] for n in names}, tests_held)  # fmt: skip
        return {"metric": METRIC, "candidates": per_candidate, "paired_validation": tests_validation,
                "paired_held_out": tests_held, **verdict}  # fmt: skip


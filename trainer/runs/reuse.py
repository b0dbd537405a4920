"""The one rule for reusing a finished phase, for every recipe (docs/trainer.md, "Layout"): a finished phase (its
result ok, its export there) is reused only if ``phase_inputs.json`` equals what this run would give it; the loop and
the experiments refuse a stale phase naming each difference (:class:`StaleResultError`), the demo trains it again.

The run engine writes a phase's inputs (:func:`record`, atomically) the moment that phase returns ok, not after its
group, so a loop killed between two phases leaves the first one's inputs beside its result. A finished result
without recorded inputs (killed between the two writes, or finished by something that records none, such as
``trainer run``) is never reused: what it was trained from is unknown. The loop and the experiments refuse it naming
its folder, the demo trains it again."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.golden import sha256_file
from trainer.phases.launch import CONFIG_DIR, PhaseResult, PhaseRun, read_result
from trainer.runs.record import read_json
from trainer.serving.identity import fingerprint

PHASE_INPUTS = "phase_inputs.json"
TRAIN_FILES = "data.train_files="


class StaleResultError(RuntimeError):
    """A recorded phase result was trained from other inputs than this run would give it."""


def phase_inputs(
    name: str,
    model: str,
    data_dir: Path,
    profile: str = "gpu",
    overrides: Sequence[str] = (),
    reward_model: str | None = None,
) -> dict[str, Any]:
    """What a phase's result depends on: its start model's content, its data files, the profile, the overrides
    that change what it learns, the content of the config files its command composes and, for a phase whose
    reward runs a model (the pipeline reward's frozen π2), that model's content (``reward_model``)."""
    from trainer.phases.launch import check_profile, composed_files

    files = sorted((data_dir / name).glob("*.parquet")) if (data_dir / name).is_dir() else []
    composed = composed_files(name, check_profile(profile))
    return {
        "model_in": fingerprint(model),
        "data": {f.name: sha256_file(f) for f in files},
        "profile": profile,
        "overrides": list(overrides),
        "configs": {str(p.relative_to(CONFIG_DIR)): sha256_file(p) for p in composed},
        **({"reward_model": fingerprint(reward_model)} if reward_model else {}),
    }


def run_inputs(run: PhaseRun) -> dict[str, Any]:
    """:func:`phase_inputs` of a phase run, without its ``placed`` overrides (those its GPU placement added: a
    resume on another node's GPUs trains the same thing); a ``data.train_files`` override is an input by content
    (its prompts' ids, in order), not by path, so a folder moved to another node keeps its phases."""
    learned = [o for o in run.overrides if o not in run.placed and not o.startswith(TRAIN_FILES)]
    inputs = phase_inputs(run.phase.name, run.model_path, run.data_dir, run.profile, learned, run.reward_model)
    files = [o.removeprefix(TRAIN_FILES) for o in run.overrides if o.startswith(TRAIN_FILES)]
    return inputs | ({"train_files": prompt_ids_sha256(Path(files[-1]))} if files else {})


def prompt_ids_sha256(path: Path) -> str | None:
    """The sha256 of a train set's prompt ids in order (None: no such file yet, as in a dry run)."""
    import pyarrow.parquet as pq

    from trainer.data.train_set import rl_row_ids

    if not path.is_file():
        return None
    ids = rl_row_ids(pq.read_table(path, columns=["extra_info"]), path)
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def inputs_difference(recorded: dict[str, Any], now: dict[str, Any]) -> str:
    """The keys in which two phase inputs differ, each with both values."""
    keys = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
    return "; ".join(f"{k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}" for k in keys)


def finished(out_dir: Path) -> PhaseResult | None:
    """The recorded result if the phase finished and its exported model is present."""
    res = read_result(out_dir)
    if res is None or res.status != "ok" or not res.hf_dir or not Path(res.hf_dir).exists():
        return None
    return res


@dataclass(frozen=True)
class Verdict:
    result: PhaseResult | None  # the finished result, if there is one
    difference: str | None  # how its recorded inputs differ from the current ones (None: the same, or none recorded)
    unrecorded: bool = False  # the result is finished but no inputs were recorded beside it

    @property
    def reusable(self) -> bool:
        return self.result is not None and self.difference is None and not self.unrecorded

    def why_not(self, out_dir: Path) -> str | None:
        """Why a finished result cannot be reused (None: it can, or there is none)."""
        if self.result is None or self.reusable:
            return None
        if self.unrecorded:
            return (f"its result in {out_dir} has no {PHASE_INPUTS} (the run stopped before recording what it was "
                    "trained from), so its inputs are unknown")  # fmt: skip
        return f"its recorded result was trained from other inputs ({self.difference})"


def check(out_dir: Path, inputs: dict[str, Any]) -> Verdict:
    done = finished(out_dir)
    if done is None:
        return Verdict(None, None)
    recorded = read_json(out_dir / PHASE_INPUTS)
    if not isinstance(recorded, dict):
        return Verdict(done, None, unrecorded=True)
    return Verdict(done, inputs_difference(recorded, inputs) or None)


def reuse_or_refuse(out_dir: Path, inputs: dict[str, Any], label: str) -> PhaseResult | None:
    """The finished result to reuse, None when the phase has to run, or :class:`StaleResultError` (one line) when it
    finished from other inputs, or from unrecorded ones (``label`` names the phase in the message)."""
    verdict = check(out_dir, inputs)
    why = verdict.why_not(out_dir)
    if why is not None:
        raise StaleResultError(f"phase {label}: {why}; move {out_dir} aside to train it again from the current ones")
    return verdict.result


def record(out_dir: Path, inputs: dict[str, Any]) -> None:
    """Write the inputs a phase was just trained from beside its result, atomically (a temporary file renamed over
    it): a reader sees all of them or none."""
    path = out_dir / PHASE_INPUTS
    tmp = path.with_name(f".{PHASE_INPUTS}.tmp")
    tmp.write_text(json.dumps(inputs, indent=2) + "\n")
    os.replace(tmp, path)


def forget(out_dir: Path) -> None:
    """Remove a phase's recorded inputs before it is launched again: a result it writes then never sits beside
    another launch's inputs."""
    (out_dir / PHASE_INPUTS).unlink(missing_ok=True)

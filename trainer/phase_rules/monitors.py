"""Did the policy move? Per-step monitors of a GRPO phase, summarised into its ``phase_result.json``.

Earlier GPU runs looked healthy (no errors, rewards logged) and changed nothing: entropy ~0.01, the
KL to the reference 0.002 after 10 steps, a PPO clip fraction <= 7e-4, gradient norms 0.1-0.23,
every limit slack. Such a run must say so in its result, not leave it to someone reading curves.

Per step, from VERL's file logger (``metrics.jsonl``, lines ``{"step", "data"}``):

- ``ppo_kl`` (``actor/ppo_kl``): KL between the rollout-time and the updated policy within a step;
- ``kl_to_ref`` (``actor/kl_loss``): the KL loss against the frozen reference = the start policy;
- ``clipfrac`` / ``clipfrac_lower`` (``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``);
- ``entropy`` (``actor/entropy``, or the update's ``actor/entropy_loss`` where the old_log_prob pass is
  skipped), ``grad_norm`` (``actor/grad_norm``);
- ``evicted_groups`` (``training/filter_groups/evicted_samples``: VERL counts evicted *groups* under
  that name) and ``generated_prompts`` (``training/dynamic_sampling/generated_prompts``, ours);
- ``valid_share`` (``training/valid_output/share``, ours: the share of the step's samples whose
  reward reported ``valid_json``), and per validation ``val_valid_share`` (``val-aux/<ds>/valid_json/mean@N``).

``policy_moved`` is whether the largest ``kl_to_ref`` of the run reached ``monitors.kl_floor``
(config, ``grpo_base.yaml``); ``None`` when no step logged it (no KL loss, or no step ran).

Dynamic sampling's budget also lives here. VERL 0.9.1's V1 replay buffer ignores
``algorithm.filter_groups.max_num_gen_batches`` (it logs a warning) and refills evicted groups for
ever: once every group of the prompt set is all-equal, a step never ends. Our trainer counts the
prompts each step generates and stops the phase past ``max_num_gen_batches x train_batch_size``.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.phase_rules.failure_mask import cause_of

MONITORS_FILE = "monitors.json"  # the resolved ``monitors`` block, next to the checkpoints
DEFAULT_KL_FLOOR = 0.01
STEP_KEYS: dict[str, str] = {
    "ppo_kl": "actor/ppo_kl",
    "kl_to_ref": "actor/kl_loss",
    "clipfrac": "actor/pg_clipfrac",
    "clipfrac_lower": "actor/pg_clipfrac_lower",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "score": "critic/score/mean",
    "evicted_groups": "training/filter_groups/evicted_samples",
    "generated_prompts": "training/dynamic_sampling/generated_prompts",
    "valid_share": "training/valid_output/share",
}
# Where the old_log_prob pass is skipped (algorithm.rollout_correction.bypass_mode), the entropy comes from
# the update (actor.calculate_entropy): the mean over the step's micro batches, on the updating policy.
UPDATE_ENTROPY = "actor/entropy_loss"
_VAL_VALID = re.compile(r"^val-(?:core|aux)/(?P<ds>[^/]+)/valid_json/mean@\d+$")


def step_monitors(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per logged step that trained or validated: the keys of :data:`STEP_KEYS` it has."""
    out = []
    for row in rows:
        data = row.get("data") or {}
        entry: dict[str, Any] = {"step": int(row["step"])}
        for name, key in STEP_KEYS.items():
            if isinstance(data.get(key), int | float):
                entry[name] = float(data[key])
        if "entropy" not in entry and isinstance(data.get(UPDATE_ENTROPY), int | float):
            entry["entropy"] = float(data[UPDATE_ENTROPY])
        val = {m["ds"]: float(v) for k, v in data.items() if (m := _VAL_VALID.match(k)) and isinstance(v, int | float)}
        if val:
            entry["val_valid_share"] = val
        if len(entry) > 1:
            out.append(entry)
    return out


def summarise(rows: Sequence[Mapping[str, Any]], kl_floor: float = DEFAULT_KL_FLOOR) -> dict[str, Any]:
    """The ``monitors`` block of a phase result: per-step values, run-level figures and the verdict."""
    steps = step_monitors(rows)
    trained = [s for s in steps if "ppo_kl" in s or "kl_to_ref" in s]

    def values(name: str) -> list[float]:
        return [s[name] for s in trained if name in s]

    kl = values("kl_to_ref")
    max_kl = max(kl) if kl else None
    moved = None if max_kl is None else max_kl >= kl_floor
    if moved is None and trained:
        verdict = (
            "no step logged actor/kl_loss (the KL loss is off: actor_rollout_ref.actor.use_kl_loss=false, "
            "no reference pass): cannot tell whether the policy moved from the KL; see entropy and validation"
        )
    elif moved is None:
        verdict = "no step logged actor/kl_loss: cannot tell whether the policy moved"
    elif moved:
        verdict = f"policy moved: KL to the start policy reached {max_kl:.3g} (floor {kl_floor:g})"
    else:
        verdict = (
            f"POLICY DID NOT MOVE: the KL to the start policy stayed below {kl_floor:g} (max {max_kl:.3g} over "
            f"{len(trained)} steps); the run changed next to nothing"
        )

    def mean(name: str) -> float | None:
        v = values(name)
        return round(statistics.fmean(v), 6) if v else None

    def biggest(name: str) -> float | None:
        v = values(name)
        return max(v) if v else None

    return {
        "kl_floor": kl_floor,
        "policy_moved": moved,
        "verdict": verdict,
        "trained_steps": len(trained),
        "max_kl_to_ref": max_kl,
        "max_abs_ppo_kl": max((abs(x) for x in values("ppo_kl")), default=None),
        "mean_clipfrac": mean("clipfrac"),
        "max_clipfrac": biggest("clipfrac"),
        "mean_entropy": mean("entropy"),
        "last_entropy": values("entropy")[-1] if values("entropy") else None,
        "max_grad_norm": biggest("grad_norm"),
        "evicted_groups": sum(values("evicted_groups")) if values("evicted_groups") else 0.0,
        "mean_valid_share": mean("valid_share"),
        "steps": steps,
    }


def write_monitor_config(ckpt_dir: Path, kl_floor: float) -> Path:
    """The trainer records its resolved ``monitors`` block; :func:`read_kl_floor` gives it to the phase result."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / MONITORS_FILE
    path.write_text(json.dumps({"kl_floor": kl_floor}) + "\n")
    return path


def read_kl_floor(ckpt_dir: Path) -> float:
    path = ckpt_dir / MONITORS_FILE
    if not path.is_file():
        return DEFAULT_KL_FLOOR
    return float(json.loads(path.read_text()).get("kl_floor", DEFAULT_KL_FLOOR))


# -- dynamic sampling's budget -----------------------------------------------------------------------


class DynamicSamplingExhaustedError(RuntimeError):
    """A training step generated its whole budget of prompts without enough informative groups."""


@dataclass(frozen=True)
class DynamicSamplingBudget:
    enabled: bool
    train_batch_size: int
    max_num_gen_batches: int  # <= 0: unbounded (VERL's meaning of the key)

    @classmethod
    def from_config(cls, config: Any) -> DynamicSamplingBudget:
        fg = config.algorithm.get("filter_groups") or {}
        return cls(
            enabled=bool(fg.get("enable", False)),
            train_batch_size=int(config.data.train_batch_size),
            max_num_gen_batches=int(fg.get("max_num_gen_batches", 0) or 0),
        )

    @property
    def max_prompts(self) -> int | None:
        """Prompts one step may generate (its first batch included); None: no bound."""
        if not self.enabled or self.max_num_gen_batches <= 0:
            return None
        return self.max_num_gen_batches * self.train_batch_size

    def check(self, step: int, generated: int, more: int) -> None:
        """Raise before a refill of ``more`` prompts would take the step past its budget."""
        cap = self.max_prompts
        if cap is None or generated + more <= cap:
            return
        raise DynamicSamplingExhaustedError(
            f"training step {step}: dynamic sampling generated {generated} prompts and needs {more} more, past "
            f"algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches} x train_batch_size "
            f"{self.train_batch_size} = {cap}, without {self.train_batch_size} groups whose rewards differ: "
            "no headroom left on this prompt set. Filter the prompts (trainer preflight-filter) or raise the "
            "temperature; the checkpoints saved so far stay under checkpoints/ (trainer export)."
        )


def valid_output_metrics(extra_fields: Sequence[Any], padding: Sequence[bool] | None = None) -> dict[str, float]:
    """``training/valid_output/*`` of a step's samples, from each trajectory's ``extra_fields`` (VERL
    keeps the reward function's extra keys under ``reward_extra_info``); padding and masked samples are skipped.
    Empty when no sample reported ``valid_json``."""
    flags = []
    for i, fields in enumerate(extra_fields):
        if padding is not None and padding[i]:
            continue
        fields = getattr(fields, "data", fields)
        info = fields.get("reward_extra_info", {}) if isinstance(fields, Mapping) else {}
        if isinstance(info, Mapping) and cause_of(info) is not None:
            continue  # a masked sample (an infrastructure failure) says nothing of the policy's output
        if isinstance(info, Mapping) and info.get("valid_json") is not None:
            flags.append(bool(info["valid_json"]))
    if not flags:
        return {}
    return {"training/valid_output/share": sum(flags) / len(flags), "training/valid_output/samples": float(len(flags))}

"""Gradient checkpointing and micro batches of a GRPO phase, chosen by the policy's size.

A 135M policy fits a whole mini batch's samples in one micro batch per GPU without recomputing
activations; a 7B one does not. One fixed setting in the profile is wrong for one of them: with
checkpointing on and micro batches of 16, the 135M update took a third longer than without, and every
extra micro batch is another forward, backward and all-reduce of fixed cost.

The rule (``sizing`` in the gpu profile, applied by :mod:`trainer.in_verl.verl_main` before VERL
validates the config): the parameters are counted from the model's ``config.json``; the per-GPU
share of a mini batch is ``ppo_mini_batch_size x rollout.n / (n_gpus_per_node x nnodes)`` samples.

| parameters | gradient checkpointing | micro batch per GPU (at most) |
|---|---|---|
| up to ``small_params`` (1e9) | off | ``small_micro`` (64) |
| up to ``medium_params`` (8e9) | on | ``medium_micro`` (16) |
| more | on | ``large_micro`` (4) |

The micro batch is the largest divisor of the per-GPU share not above that cap, so every mini batch
splits into whole micro batches on 1, 2, 4 or 8 GPUs. The log-prob passes (reference, and the
actor's recomputation where it runs) take the same micro batch. A value the user set is kept: only
keys left ``null`` are filled, and ``sizing.auto=false`` turns the rule off. The choice is printed
and written to ``checkpoints/sizing.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SIZING_FILE = "sizing.json"
# The keys the rule fills, where the config leaves them null.
CHECKPOINTING_KEY = "actor_rollout_ref.model.enable_gradient_checkpointing"
MICRO_KEYS = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
)


@dataclass(frozen=True)
class SizingRule:
    small_params: float = 1e9
    medium_params: float = 8e9
    small_micro: int = 64
    medium_micro: int = 16
    large_micro: int = 4

    @classmethod
    def from_mapping(cls, raw: dict[str, Any]) -> SizingRule:
        known = {k: raw[k] for k in asdict(cls()) if k in raw}
        return cls(**known)


@dataclass(frozen=True)
class Sizing:
    params: int
    per_gpu_samples: int
    gradient_checkpointing: bool
    micro_batch: int

    def describe(self) -> str:
        return (
            f"[sizing] {self.params / 1e6:.1f}M parameters, {self.per_gpu_samples} samples per GPU per mini batch: "
            f"gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}, micro batch {self.micro_batch}"
        )


def count_params(model_config: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its Hugging Face ``config.json`` (Llama/Qwen/Mistral
    layout: attention with grouped KV heads, a gated MLP, embeddings tied or not; norms ignored)."""
    try:
        h = int(model_config["hidden_size"])
        layers = int(model_config["num_hidden_layers"])
        vocab = int(model_config["vocab_size"])
        inter = int(model_config.get("intermediate_size", 4 * h))
    except KeyError as exc:
        raise ValueError(f"model config.json: {exc.args[0]} is missing (needed to count parameters)") from None
    heads = int(model_config.get("num_attention_heads", 1))
    kv_heads = int(model_config.get("num_key_value_heads", heads))
    head_dim = int(model_config.get("head_dim", h // max(heads, 1)))
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    mlp = 3 * h * inter
    embeddings = vocab * h * (1 if model_config.get("tie_word_embeddings", False) else 2)
    return layers * (attention + mlp) + embeddings


def largest_divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def choose(params: int, per_gpu_samples: int, rule: SizingRule) -> Sizing:
    if per_gpu_samples < 1:
        raise ValueError(f"sizing: a mini batch gives {per_gpu_samples} samples per GPU; it must be at least 1")
    if params <= rule.small_params:
        checkpointing, cap = False, rule.small_micro
    elif params <= rule.medium_params:
        checkpointing, cap = True, rule.medium_micro
    else:
        checkpointing, cap = True, rule.large_micro
    return Sizing(params, per_gpu_samples, checkpointing, largest_divisor_at_most(per_gpu_samples, cap))


def per_gpu_samples(config: Any) -> int:
    arr = config.actor_rollout_ref
    gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    samples = int(arr.actor.ppo_mini_batch_size) * int(arr.rollout.n)
    if samples % gpus:
        raise ValueError(
            f"sizing: a mini batch of {samples} samples (ppo_mini_batch_size x rollout.n) does not split over "
            f"{gpus} GPUs (trainer.n_gpus_per_node x trainer.nnodes)"
        )
    return samples // gpus


def apply(config: Any) -> Sizing | None:
    """Fill the null keys of :data:`MICRO_KEYS` and :data:`CHECKPOINTING_KEY` by the rule (an OmegaConf
    config, changed in place). Returns the choice, or None where ``sizing.auto`` is off or absent."""
    from omegaconf import OmegaConf, open_dict

    block = config.get("sizing")
    if not block or not block.get("auto", False):
        return None
    model_dir = Path(str(config.actor_rollout_ref.model.path))
    cfg_file = model_dir / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"sizing: {cfg_file} not found (the policy's config.json counts its parameters); "
                         "set sizing.auto=false and the micro batches yourself for a model without one")  # fmt: skip
    raw = OmegaConf.to_container(block, resolve=True)
    assert isinstance(raw, dict)
    sizing = choose(count_params(json.loads(cfg_file.read_text())), per_gpu_samples(config),
                    SizingRule.from_mapping({str(k): v for k, v in raw.items()}))  # fmt: skip
    with open_dict(config):
        if OmegaConf.select(config, CHECKPOINTING_KEY) is None:
            OmegaConf.update(config, CHECKPOINTING_KEY, sizing.gradient_checkpointing)
        for key in MICRO_KEYS:
            if OmegaConf.select(config, key) is None:
                OmegaConf.update(config, key, sizing.micro_batch)
    return sizing


def record(config: Any, sizing: Sizing) -> Path:
    """``checkpoints/sizing.json``: the rule's choice beside what the phase then ran with."""
    from omegaconf import OmegaConf

    ckpt = Path(str(config.trainer.default_local_dir))
    ckpt.mkdir(parents=True, exist_ok=True)
    ran = {key: OmegaConf.select(config, key) for key in (CHECKPOINTING_KEY, *MICRO_KEYS)}
    path = ckpt / SIZING_FILE
    path.write_text(json.dumps({"choice": asdict(sizing), "ran_with": ran}, indent=2) + "\n")
    return path

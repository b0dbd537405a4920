"""One seed for the randomness of a GRPO phase.

VERL 0.9.1 draws a GRPO run's randomness from four settings, each with its own default: the order of the
training prompts (``data.seed``, null: VERL's fixed default), the rollout's sampling
(``actor_rollout_ref.rollout.seed``, 42), the actor's mini-batch shuffle
(``actor_rollout_ref.actor.data_loader_seed``, 42) and its FSDP initialisation
(``actor_rollout_ref.actor.fsdp_config.seed``, 42). A second run of an arm with other samples and another
prompt order, the replicate a learning result needs, sets all four: ``--rl-seed N`` of the loop and the A/B
experiments does, before the user's own overrides (which win).
"""

from __future__ import annotations

RL_SEED_KEYS = (
    "data.seed",
    "actor_rollout_ref.rollout.seed",
    "actor_rollout_ref.actor.data_loader_seed",
    "actor_rollout_ref.actor.fsdp_config.seed",
)


def rl_seed_overrides(seed: int | None) -> tuple[str, ...]:
    """The Hydra overrides that give a GRPO phase the seed ``seed`` (none: VERL's defaults)."""
    if seed is None:
        return ()
    if seed < 0:
        raise ValueError(f"rl seed: {seed} is negative (a seed is an integer >= 0)")
    return tuple(f"{key}={seed}" for key in RL_SEED_KEYS)

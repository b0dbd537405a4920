"""trainer/phases/seeds.py: one RL seed becomes VERL's four seeds, each a key VERL's config has."""

from __future__ import annotations

import pytest

from tests.trainer.phases.test_launch import composed, env  # noqa: F401  (env is a fixture)
from trainer.phases.seeds import RL_SEED_KEYS, rl_seed_overrides


def test_no_seed_leaves_verls_defaults_and_a_negative_one_is_refused() -> None:
    assert rl_seed_overrides(None) == ()
    assert rl_seed_overrides(0) == tuple(f"{k}=0" for k in RL_SEED_KEYS)
    with pytest.raises(ValueError, match="-1 is negative"):
        rl_seed_overrides(-1)


@pytest.mark.parametrize("phase", ["b1", "b2", "c1", "c2"])
def test_every_seed_key_lands_in_the_composed_phase_config(env: None, phase: str) -> None:  # noqa: F811
    """Hydra refuses an override of a key the config lacks, so each key composing with the new value shows it
    is one of the phase's VERL settings (not a new key that VERL would ignore)."""
    default = composed(f"{phase}_grpo", "profile=gpu")
    seeded = composed(f"{phase}_grpo", "profile=gpu", *rl_seed_overrides(5))
    for key in RL_SEED_KEYS:
        node_default, node_seeded = default, seeded
        for part in key.split("."):
            node_default, node_seeded = node_default[part], node_seeded[part]
        assert node_seeded == 5 and node_default != 5, key

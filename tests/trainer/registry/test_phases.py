"""The phase registry owns every fact about a phase; the phase configs and the derived maps agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.trainer.phases.test_launch import composed, env  # noqa: F401  (env is a fixture)
from trainer.in_verl.reward_batcher import SCORE_KEYS
from trainer.phases.launch import CONFIG_DIR
from trainer.registry.phases import (
    BUILD_PHASES,
    GRPO_PHASES,
    PHASES,
    REWARD_KINDS,
    SFT_PHASES,
    get_phase,
    reward_of,
    reward_prompt,
    sft_phase_for,
)

# What a phase config file itself names (before composition); the shared bases and profiles are not phases.
PHASE_FILES = sorted(p for p in CONFIG_DIR.glob("*.yaml") if p.stem not in ("grpo_base", "sft_base"))


def test_every_phase_config_file_is_a_registered_phase() -> None:
    assert sorted(p.stem for p in PHASE_FILES) == sorted(ph.config_name for ph in PHASES.values())


@pytest.mark.parametrize("path", PHASE_FILES, ids=lambda p: p.stem)
def test_each_phase_config_names_what_the_registry_says(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    phase = get_phase(raw["phase"]["name"])
    assert path.stem == phase.config_name
    base = "grpo_base" if phase.kind == "grpo" else "sft_base"
    assert base in raw["defaults"]
    if phase.kind == "grpo":
        assert raw["early_stopping"]["data_source"] == phase.reward
        assert raw["data"]["max_response_length"] == phase.max_response_length
        # the reward config a phase spells out is the one of its reward kind
        kwargs = raw.get("reward", {}).get("custom_reward_function", {}).get("reward_kwargs", {})
        own = {"schema": "schema_config", "table": "table_config", "pipeline": "pipeline_config"}[phase.reward]
        assert not {k for k in kwargs if k.endswith("_config")} - {own}, kwargs
    else:
        assert "early_stopping" not in raw and "reward" not in raw


@pytest.mark.parametrize("name", list(PHASES))
def test_composed_configs_read_the_phase_data_and_length(env: None, name: str) -> None:  # noqa: F811
    phase = get_phase(name)
    profile = "profile=gpu" if phase.kind == "grpo" else "sft_profile=gpu"
    c = composed(phase.config_name, profile)
    assert c.phase.name == name
    assert c.data.train_files == f"/data/{name}/train.parquet"
    assert c.data.val_files == f"/data/{name}/validation.parquet"
    if phase.kind == "grpo":
        assert c.early_stopping.data_source == phase.reward
        assert c.data.max_response_length == phase.max_response_length


def test_the_derived_maps() -> None:
    assert set(PHASES) == {"a1", "a2", "b1", "b2", "c1", "c2"}
    assert SFT_PHASES == ("a1", "a2") and GRPO_PHASES == ("b1", "b2", "c1", "c2")
    assert BUILD_PHASES == ("a1", "a2", "b1", "b2", "c1")  # C2: precompute-schemas from a served π1
    assert {p: reward_of(p) for p in GRPO_PHASES} == {"b1": "schema", "b2": "table", "c1": "pipeline", "c2": "table"}
    assert {k: sft_phase_for(k) for k in REWARD_KINDS} == {"schema": "a1", "table": "a2", "pipeline": "a1"}
    assert {k: reward_prompt(k) for k in REWARD_KINDS} == {
        "schema": "stage1", "table": "stage2_gold", "pipeline": "stage1"
    }  # fmt: skip
    assert set(SCORE_KEYS) == set(REWARD_KINDS)


def test_a_phase_trains_the_policy_of_its_sft_partner() -> None:
    for phase in PHASES.values():
        partner = get_phase(phase.sft_partner)
        assert partner.kind == "sft" and partner.policy == phase.policy
        assert (phase.kind == "grpo") == (phase.reward is not None) == bool(phase.ground_truth)


def test_bad_names_are_named() -> None:
    with pytest.raises(ValueError, match="phase must be one of"):
        get_phase("d")
    with pytest.raises(ValueError, match="trains on no reward"):
        reward_of("a1")
    with pytest.raises(ValueError, match="reward kind must be one of"):
        sft_phase_for("stage1")

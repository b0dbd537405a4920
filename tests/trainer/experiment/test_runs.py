"""The phase runs each stage builds: the values of their overrides, GPUs and inputs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.trainer.test_loop import SAMPLE
from trainer.experiment.config import ExperimentConfig
from trainer.experiment.placement import ArmPlacement
from trainer.experiment.runs import (
    arm_run,
    control_run,
    improvable_train_files,
    rl_overrides,
    sft_run,
    source_train_files,
    train_batch_size,
)


def cfg(tmp_path: Path, **kw: object) -> ExperimentConfig:
    return ExperimentConfig(golden=SAMPLE, workdir=tmp_path, **kw)  # type: ignore[arg-type]


def test_rl_overrides_on_one_gpu_per_arm(tmp_path: Path) -> None:
    c = cfg(tmp_path, rl_steps=10)
    got = rl_overrides(c, 1.3, ArmPlacement.of(("0", "1")).a)
    assert got == (
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "trainer.total_training_steps=10",
        "trainer.test_freq=5",
        "trainer.save_freq=5",
        "data.train_max_samples=2048",
        "trainer.total_epochs=100",
        "actor_rollout_ref.rollout.temperature=1.3",
    )


def test_rl_overrides_on_cpu_keep_the_profile_and_validate_within_the_steps(tmp_path: Path) -> None:
    got = rl_overrides(cfg(tmp_path, profile="cpu-smoke", rl_steps=1, rl_test_freq=5), 1.0, None)
    assert got == (
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "trainer.save_freq=1",
        "data.train_max_samples=2048",
        "trainer.total_epochs=100",
        "actor_rollout_ref.rollout.temperature=1.0",
    )


def test_an_rl_seed_seeds_both_arms_before_the_users_overrides(tmp_path: Path) -> None:
    c = cfg(tmp_path, profile="cpu-smoke", rl_seed=7, rl_extra=("data.seed=9",))
    got = rl_overrides(c, 1.0, None)
    assert got[-4:] == (
        "data.seed=7",
        "actor_rollout_ref.rollout.seed=7",
        "actor_rollout_ref.actor.data_loader_seed=7",
        "actor_rollout_ref.actor.fsdp_config.seed=7",
    )
    run = arm_run(c, "b1", "/a1/hf", "http://r", tmp_path / "b1", tmp_path / "data", None, 1.0)
    assert run.overrides.index("data.seed=7") < run.overrides.index("data.seed=9")  # the user's wins
    assert not any("seed" in o for o in rl_overrides(cfg(tmp_path, profile="cpu-smoke"), 1.0, None))


def test_arm_run_places_the_arm_and_puts_the_users_overrides_last(tmp_path: Path) -> None:
    c = cfg(tmp_path, rl_extra=("trainer.test_freq=2",), rl_micro=16)
    p = ArmPlacement.of(("0", "1", "2", "3"))
    run = arm_run(c, "c1", "/a1/hf", "http://pipe", tmp_path / "c1", tmp_path / "data", p.b, 1.0, "data.train_files=/x")
    assert run.phase.name == "c1" and run.reward_url == "http://pipe" and run.model_path == "/a1/hf"
    assert run.gpus == ("2", "3") and run.overrides[0] == "trainer.n_gpus_per_node=2"
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16" in run.overrides
    assert run.overrides[-2:] == ("data.train_files=/x", "trainer.test_freq=2")
    assert run.env({})["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert run.command()[2:5] == ["trainer.in_verl.verl_main", "--config-name", "c1_grpo"]


def test_sft_run_on_a_gpu_and_on_cpu(tmp_path: Path) -> None:
    c = cfg(tmp_path, sft_overrides=("trainer.total_training_steps=2",))
    run = sft_run(c, "a2", "/base", tmp_path / "a2", tmp_path / "data", ArmPlacement.of(("0", "1")).b)
    assert run.gpus == ("1",) and run.nproc == 1 and run.model_path == "/base" and run.reward_url is None
    assert run.overrides == ("trainer.n_gpus_per_node=1", "trainer.total_training_steps=2")
    assert "--nproc_per_node=1" in run.command() and "a2_sft" in run.command()
    cpu = sft_run(cfg(tmp_path, profile="cpu-smoke"), "a1", "/base", tmp_path / "a1", tmp_path / "data", None)
    assert cpu.gpus == () and cpu.overrides == () and "sft_profile=cpu-smoke" in cpu.command()


def test_control_run_keeps_the_controls_own_schedule(tmp_path: Path) -> None:
    c = cfg(tmp_path, rl_steps=30)
    prompts = tmp_path / "b1_improvable.parquet"
    run, ccfg = control_run(
        c, "b1", "/a1", "http://local", prompts, tmp_path / "b1_control", ArmPlacement.of(("0",)).a, 1.6
    )
    assert run.gpus == ("0",) and run.reward_url == "http://local"
    assert f"trainer.total_training_steps={ccfg.steps}" in run.overrides  # not the arms' 30
    assert "trainer.total_training_steps=30" not in run.overrides
    assert run.overrides[-1] == "actor_rollout_ref.rollout.temperature=1.6"
    assert f"data.train_files={(tmp_path / 'b1_control' / 'control_prompts.parquet').resolve()}" in run.overrides


def prompts(path: Path, n: int) -> Path:
    pq.write_table(pa.table({"x": list(range(n))}), path)
    return path


def test_train_batch_size_is_the_profiles_unless_overridden() -> None:
    assert train_batch_size("gpu") == 64
    assert train_batch_size("cpu-smoke") == 2
    assert train_batch_size("gpu", ("data.train_batch_size=32", "x=1")) == 32


def test_improvable_set_only_where_it_fills_a_batch(tmp_path: Path) -> None:
    assert improvable_train_files(cfg(tmp_path), "b1", tmp_path / "none.parquet") == (None, "")
    on = cfg(tmp_path, rl_improvable=True)
    files, why = improvable_train_files(on, "b2", prompts(tmp_path / "b2.parquet", 49))
    assert files is None and "49 improvable prompts" in why and "fewer than a batch of 64" in why
    assert "training on the train split" in why
    files, why = improvable_train_files(on, "b1", prompts(tmp_path / "b1.parquet", 64))
    assert files == f"data.train_files={tmp_path / 'b1.parquet'}" and "64 improvable prompts" in why
    files, why = improvable_train_files(on, "c2", tmp_path / "c2.parquet")
    assert files is None and "not swept" in why
    small = cfg(tmp_path, rl_improvable=True, rl_extra=("data.train_batch_size=32",))
    assert (
        improvable_train_files(small, "b2", tmp_path / "b2.parquet")[0] == f"data.train_files={tmp_path / 'b2.parquet'}"
    )


def test_source_sets_name_their_sources_and_are_the_improvable_fallback(tmp_path: Path) -> None:
    assert source_train_files(cfg(tmp_path), "b2", tmp_path / "none.parquet") == (None, "")
    on = cfg(tmp_path, rl_sources=("wikitabletext",))
    files, why = source_train_files(on, "b2", tmp_path / "b2_wikitabletext.parquet")  # dry run: not written yet
    assert files == f"data.train_files={tmp_path / 'b2_wikitabletext.parquet'}"
    assert why == f"b2: training on the wikitabletext prompts ({tmp_path / 'b2_wikitabletext.parquet'})"
    _files, why = source_train_files(on, "b2", prompts(tmp_path / "b2_wikitabletext.parquet", 70))
    assert why.startswith("b2: training on its 70 wikitabletext prompts")
    both = cfg(tmp_path, rl_improvable=True, rl_sources=("wikitabletext",))
    files, why = improvable_train_files(both, "b2", prompts(tmp_path / "b2.parquet", 49))
    assert files is None and why.endswith("fewer than a batch of 64; training on its wikitabletext prompts")


@pytest.mark.parametrize(
    "bad", [{"control": "later"}, {"preflight_phases": ("a1",)}, {"data_phases": ("c2",)}, {"temps": ()}]
)
def test_the_config_refuses_what_cannot_run(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        cfg(tmp_path, **bad)


def test_a_mixed_arm_trains_on_its_chosen_sets_mix_and_c2_on_its_chosen_set(tmp_path: Path) -> None:
    from trainer.experiment.runs import mixed_train_files

    chosen = f"data.train_files={tmp_path / 'b2_wikitabletext.parquet'}"
    off = cfg(tmp_path, rl_sources=("wikitabletext",))
    assert mixed_train_files(off, "b2", chosen, tmp_path / "sets") == (chosen, "")
    on = cfg(tmp_path, rl_sources=("wikitabletext",), rl_mix_share=0.25)
    mixed = tmp_path / "sets" / "b2_wikitabletext+mix.parquet"
    assert mixed_train_files(on, "b2", chosen, tmp_path / "sets") == (
        f"data.train_files={mixed}", f"b2: 0.25 of its prompts from the other sources ({mixed})"
    )
    files, why = mixed_train_files(on, "c2", chosen, tmp_path / "sets")
    assert files == chosen and why.startswith("c2: not mixed")
    assert mixed_train_files(on, "b2", None, tmp_path / "sets") == (None, "")  # the rl stage refuses it


@pytest.mark.parametrize(
    ("share", "why"), [(-0.1, "at least 0 and below 1"), (1.0, "at least 0 and below 1"), (0.2, "needs --rl-sources")]
)
def test_the_config_refuses_a_share_out_of_range_or_without_a_set(tmp_path: Path, share: float, why: str) -> None:
    with pytest.raises(ValueError, match=f"--rl-mix-share: {share}: .*{why}"):
        cfg(tmp_path, rl_mix_share=share)
    assert cfg(tmp_path, rl_improvable=True, rl_mix_share=0.2).rl_mix_share == 0.2

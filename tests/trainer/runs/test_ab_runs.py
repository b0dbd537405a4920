"""The phase runs an experiment builds: the values of their overrides, GPUs, train sets and inputs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.trainer.runs.test_loop import SAMPLE
from trainer.data.train_mix import TrainMixError
from trainer.data.train_set import train_batch_size
from trainer.runs.ab import Experiment
from trainer.runs.ab_plan import DESIGNS, improvable_set
from trainer.runs.config import ExperimentConfig

ON_GPU = (
    "actor_rollout_ref.rollout.enforce_eager=true",
    "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
)


def cfg(tmp_path: Path, **kw: object) -> ExperimentConfig:
    return ExperimentConfig(golden=SAMPLE, out=tmp_path, **kw)  # type: ignore[arg-type]


def exp(tmp_path: Path, design: str = "pi1-ab", **kw: object) -> Experiment:
    return Experiment(DESIGNS[design], cfg(tmp_path, **kw), say=lambda _line: None)


def test_an_arm_on_one_gpu_of_its_own(tmp_path: Path) -> None:
    run, why = exp(tmp_path, gpus=("0", "1"), rl_steps=10).arm_run(0, "http://r", 1.3)
    placed = ("trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.2", *ON_GPU)
    assert run.overrides == (
        *placed,
        "trainer.total_training_steps=10",
        "trainer.test_freq=5",
        "trainer.save_freq=5",
        "data.train_max_samples=2048",
        "trainer.total_epochs=100",
        "actor_rollout_ref.rollout.temperature=1.3",
    )
    assert run.placed == placed and run.gpus == ("0",) and why == ""  # placement is no input of what it learns
    assert run.model_path == "<a1 export>" and run.reward_model is None  # B1's reward runs no model


def test_an_arm_on_cpu_keeps_the_profile_and_validates_within_the_steps(tmp_path: Path) -> None:
    run, _why = exp(tmp_path, profile="cpu-smoke", rl_steps=1, rl_test_freq=5).arm_run(1, "http://pipe", 1.0)
    assert run.overrides == (
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "trainer.save_freq=1",
        "data.train_max_samples=2048",
        "trainer.total_epochs=100",
        "actor_rollout_ref.rollout.temperature=1.0",
    )
    assert run.placed == () and run.gpus == () and run.phase.name == "c1"


def test_an_rl_seed_seeds_both_arms_before_the_users_overrides(tmp_path: Path) -> None:
    e = exp(tmp_path, profile="cpu-smoke", rl_seed=7, rl_extra=("data.seed=9",))
    for i in (0, 1):
        run = e.arm_run(i, "http://r", 1.0)[0]
        assert run.overrides[-5:] == (
            "data.seed=7",
            "actor_rollout_ref.rollout.seed=7",
            "actor_rollout_ref.actor.data_loader_seed=7",
            "actor_rollout_ref.actor.fsdp_config.seed=7",
            "data.seed=9",  # the user's wins
        )
    assert not any("seed" in o for o in exp(tmp_path, profile="cpu-smoke").arm_run(0, "", 1.0)[0].overrides)


def prompts(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": list(range(n))}), path)
    return path


def test_an_arm_is_placed_and_the_users_overrides_come_last(tmp_path: Path) -> None:
    e = exp(tmp_path, gpus=("0", "1", "2", "3"), rl_extra=("trainer.test_freq=2",), rl_micro=16, rl_improvable=True)
    improvable = prompts(e.wd.improvable("c1"), 64)
    run, why = e.arm_run(1, "http://pipe", 1.0)
    assert run.phase.name == "c1" and run.reward_url == "http://pipe" and run.gpus == ("2", "3")
    assert run.overrides[0] == "trainer.n_gpus_per_node=2"
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16" in run.overrides
    assert run.overrides[-2:] == (f"data.train_files={improvable}", "trainer.test_freq=2")
    assert why == f"c1: training on its 64 improvable prompts ({improvable})"
    assert run.env({})["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert run.command()[2:5] == ["trainer.in_verl.verl_main", "--config-name", "c1_grpo"]


def test_sft_runs_one_gpu_each_and_on_cpu(tmp_path: Path) -> None:
    a2, a1 = exp(tmp_path, "pi2-ab", gpus=("0", "1"), base_model="/base",
                 sft_overrides=("trainer.total_training_steps=2",)).sft_runs()  # fmt: skip
    assert (a2.phase.name, a1.phase.name) == ("a2", "a1")  # the start policy's first, on arm A's GPU
    assert a2.gpus == ("0",) and a1.gpus == ("1",) and a2.nproc == 1 and a2.model_path == "/base"
    assert a2.reward_url is None and a2.overrides == ("trainer.n_gpus_per_node=1", "trainer.total_training_steps=2")
    assert "--nproc_per_node=1" in a2.command() and "a2_sft" in a2.command()
    cpu = exp(tmp_path / "cpu", profile="cpu-smoke", base_model="/base").sft_runs()[0]
    assert cpu.gpus == () and cpu.overrides == () and "sft_profile=cpu-smoke" in cpu.command()


def test_the_control_keeps_its_own_schedule(tmp_path: Path) -> None:
    e = exp(tmp_path, gpus=("0",), rl_steps=30)
    run, ccfg = e.control_run("http://local", 1.6)
    assert run.gpus == ("0",) and run.reward_url == "http://local"
    assert f"trainer.total_training_steps={ccfg.steps}" in run.overrides  # not the arms' 30
    assert "trainer.total_training_steps=30" not in run.overrides
    assert run.overrides[-1] == "actor_rollout_ref.rollout.temperature=1.6"
    assert f"data.train_files={(tmp_path / 'b1_control' / 'control_prompts.parquet').resolve()}" in run.overrides


def test_train_batch_size_is_the_profiles_unless_overridden() -> None:
    assert train_batch_size("gpu") == 64
    assert train_batch_size("cpu-smoke") == 2
    assert train_batch_size("gpu", ("data.train_batch_size=32", "x=1")) == 32


def test_improvable_set_only_where_it_fills_a_batch(tmp_path: Path) -> None:
    assert improvable_set(cfg(tmp_path), "b1", tmp_path / "none.parquet") == (None, "")
    on = cfg(tmp_path, rl_improvable=True)
    files, why = improvable_set(on, "b2", prompts(tmp_path / "b2.parquet", 49))
    assert files is None and "49 improvable prompts" in why and "fewer than a batch of 64" in why
    assert "training on the train split" in why
    files, why = improvable_set(on, "b1", prompts(tmp_path / "b1.parquet", 64))
    assert files == tmp_path / "b1.parquet" and "64 improvable prompts" in why
    files, why = improvable_set(on, "c2", tmp_path / "c2.parquet")
    assert files is None and "not swept" in why
    small = cfg(tmp_path, rl_improvable=True, rl_extra=("data.train_batch_size=32",))
    assert improvable_set(small, "b2", tmp_path / "b2.parquet")[0] == tmp_path / "b2.parquet"
    both = cfg(tmp_path, rl_improvable=True, rl_sources=("wikitabletext",))
    files, why = improvable_set(both, "b2", tmp_path / "b2.parquet")
    assert files is None and why.endswith("fewer than a batch of 64; training on its wikitabletext prompts")


def test_source_sets_name_their_sources_and_are_the_improvable_fallback(tmp_path: Path) -> None:
    e = exp(tmp_path, "pi2-ab", rl_sources=("wikitabletext",))
    path = e.wd.source_set("b2", ("wikitabletext",))
    assert e.ctx.train_files("b2", "b2", e.wd.data, write=False) == (
        path, f"b2: training on the wikitabletext prompts ({path})"  # a dry run: not written yet
    )  # fmt: skip
    prompts(path, 70)
    assert e.ctx.train_files("b2", "b2", e.wd.data, write=False)[1].startswith("b2: training on its 70 wikitabletext")
    assert exp(tmp_path / "off").ctx.train_files("b1", "b1", tmp_path / "data") == (None, "")


@pytest.mark.parametrize(
    "bad", [{"control": "later"}, {"preflight_phases": ("a1",)}, {"data_phases": ("c2",)}, {"temps": ()}]
)
def test_the_config_refuses_what_cannot_run(tmp_path: Path, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        cfg(tmp_path, **bad)


def test_a_mixed_arm_trains_on_its_chosen_sets_mix_and_c2_on_its_chosen_set(tmp_path: Path) -> None:
    chosen = tmp_path / "b2_wikitabletext.parquet"
    off = exp(tmp_path / "off", "pi2-ab", rl_sources=("wikitabletext",))
    assert off.ctx.train_files("b2", "b2", tmp_path, chosen, write=False) == (chosen, "")
    on = exp(tmp_path / "on", "pi2-ab", rl_sources=("wikitabletext",), rl_mix_share=0.25)
    mixed = on.wd.train_sets / "b2_wikitabletext+mix.parquet"
    assert on.ctx.train_files("b2", "b2", tmp_path, chosen, write=False) == (
        mixed, f"b2: 0.25 of its prompts from the other sources ({mixed})"
    )  # fmt: skip
    files, why = on.ctx.train_files("c2", "c2", tmp_path, chosen, write=False)
    assert files == chosen and why.startswith("c2: not mixed")
    improvable_only = exp(tmp_path / "imp", "pi2-ab", rl_improvable=True, rl_mix_share=0.25)
    with pytest.raises(TrainMixError, match="b2 trains on its whole train split"):  # no set filled a batch
        improvable_only.ctx.train_files("b2", "b2", tmp_path, None, write=False)


@pytest.mark.parametrize(
    ("share", "why"), [(-0.1, "at least 0 and below 1"), (1.0, "at least 0 and below 1"), (0.2, "needs --rl-sources")]
)
def test_the_config_refuses_a_share_out_of_range_or_without_a_set(tmp_path: Path, share: float, why: str) -> None:
    with pytest.raises(ValueError, match=f"--rl-mix-share: {share}: .*{why}"):
        cfg(tmp_path, rl_mix_share=share)
    assert cfg(tmp_path, rl_improvable=True, rl_mix_share=0.2).rl_mix_share == 0.2

"""The GPU profiles hold the learning run's hyper-parameters, and the CPU smoke keeps its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.phases.test_launch import composed, env  # noqa: F401  (env is a fixture)
from trainer.phases.launch import PhaseRun
from trainer.registry.phases import get_phase


def composed_command(run: PhaseRun) -> Any:
    """The config that the phase's command line composes: its ``--config-name`` and Hydra overrides,
    exactly as ``run.command()`` passes them to ``trainer.in_verl.verl_main``."""
    cmd = run.command()
    assert cmd[1:3] == ["-m", "trainer.in_verl.verl_main"]
    name = cmd[cmd.index("--config-name") + 1]
    return composed(name, *cmd[cmd.index("--config-name") + 2 :])


def gpu_run(phase: str, *overrides: str) -> PhaseRun:
    return PhaseRun(get_phase(phase), "gpu", Path("/data"), Path("/out"), "/m", "http://127.0.0.1:1", overrides)


@pytest.mark.parametrize(("phase", "response"), [("b1", 256), ("c1", 256), ("b2", 512), ("c2", 512)])
def test_grpo_gpu_recipe(env: None, phase: str, response: int) -> None:  # noqa: F811
    c = composed_command(gpu_run(phase))
    arr, actor = c.actor_rollout_ref, c.actor_rollout_ref.actor
    # dynamic sampling: all-equal groups are evicted and replaced, at most 8 batches of prompts a step
    fg = c.algorithm.filter_groups
    assert fg.enable is True and fg.metric == "reward" and fg.max_num_gen_batches == 8
    # Dr.GRPO: advantages not divided by the group's std; token-mean loss (no per-response length factor)
    assert c.algorithm.adv_estimator == "grpo_masked" and c.algorithm.norm_adv_by_std_in_grpo is False
    assert actor.loss_agg_mode == "token-mean"
    # clip-higher
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (pytest.approx(0.2), pytest.approx(0.28))
    assert arr.rollout.n == 16 and arr.rollout.temperature == 1.0
    # well over 100 Adam updates in 30 steps: train batch / mini batch (both in prompts) x epochs per step
    assert c.trainer.total_training_steps == 30 and actor.ppo_epochs == 1
    updates = c.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs * c.trainer.total_training_steps
    assert c.data.train_batch_size == 64 and actor.ppo_mini_batch_size == 8 and updates == 240
    assert actor.optim.lr == pytest.approx(2e-5)
    # validation: the whole validation split (>= 2,048 per source does not exist for WikiTableText / E2E)
    assert c.data.val_max_samples == -1 and c.data.val_files == f"/data/{phase}/validation.parquet"
    assert c.monitors.kl_floor == pytest.approx(0.01)
    assert c.data.max_response_length == response
    # no reference pass unless the KL term is asked for (the coefficient stays ready for it); the rollout's
    # log-probs stand in for the actor's recomputation, and the update logs the entropy instead
    assert actor.use_kl_loss is False and actor.kl_loss_coef == pytest.approx(1e-3)
    assert c.algorithm.rollout_correction.bypass_mode is True and actor.calculate_entropy is True
    # speed: the buffer's poll and sizing by model size; vLLM's scheduler sized for a whole step (1,024 samples),
    # asynchronous, streaming every 16 tokens; the refills stay VERL's
    assert c.replay_buffer.poll_s == pytest.approx(0.1)
    assert (arr.rollout.max_num_seqs, arr.rollout.max_num_batched_tokens) == (1024, 32768)
    vllm_args = arr.rollout.engine_kwargs.vllm
    assert vllm_args.async_scheduling is True and vllm_args.stream_interval == 16
    assert fg.max_inflight_gen_batches == 1
    assert c.sizing.auto is True and c.prompt_filter.enabled is True
    assert arr.model.enable_gradient_checkpointing is None and actor.ppo_micro_batch_size_per_gpu is None
    assert "tensorboard" in c.trainer.logger and "file" in c.trainer.logger
    # padding-free micro batches by tokens through PyTorch's varlen kernel (trainer/in_verl/packed_attention.py)
    assert arr.model.override_config.attn_implementation == "packed_sdpa"
    assert arr.model.use_remove_padding is True
    assert actor.use_dynamic_bsz is True and actor.ppo_max_token_len_per_gpu == 40960
    assert c.trainer.test_freq == c.trainer.save_freq == 5
    assert c.data.train_max_samples == 4096 and c.data.train_files.endswith("train.parquet")
    # decode graphs without torch.compile; the first batch carries dynamic sampling's expected shortfall
    assert arr.rollout.enforce_eager is False
    compilation = json.loads(arr.rollout.engine_kwargs.vllm.compilation_config)  # VERL's server json.loads a string
    assert compilation == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert c.replay_buffer.prefetch_max_factor == pytest.approx(2.0)
    assert c.ray_kwargs.ray_init.include_dashboard is False and "_node_ip_address" not in c.ray_kwargs.ray_init
    # a mini batch's samples split evenly over 1, 2, 4 or 8 GPUs (sizing then picks a micro batch dividing it)
    mini_samples = actor.ppo_mini_batch_size * arr.rollout.n
    assert all(mini_samples % gpus == 0 for gpus in (1, 2, 4, 8))


def test_the_recipe_survives_the_node_scripts_overrides(env: None) -> None:  # noqa: F811
    """An experiment arm's RL arguments (one GPU, 10 steps, the chosen temperature, the improvable set)."""
    c = composed_command(gpu_run(
        "b1", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=10",
        "actor_rollout_ref.rollout.temperature=1.3", "data.train_files=/ab/preflight/b1_improvable.parquet",
    ))  # fmt: skip
    assert c.trainer.n_gpus_per_node == 1 and c.actor_rollout_ref.rollout.temperature == 1.3
    assert c.data.train_files == "/ab/preflight/b1_improvable.parquet" and c.algorithm.filter_groups.enable


# Our own top-level blocks (VERL ignores them; trainer/phases reads them) and keys VERL 0.9.1's ppo_trainer
# leaves open by design. Every other key a phase config sets must exist in VERL's own config: a misspelt
# key composes without a word (a defaults file may add keys) and then does nothing.
OWN_BLOCKS = {"phase", "early_stopping", "failures", "monitors", "reward_ready", "replay_buffer", "sizing",
              "prompt_filter", "agent_loop_speed"}  # fmt: skip
OPEN_IN_VERL = (
    "reward.custom_reward_function.reward_kwargs",
    "actor_rollout_ref.model.override_config",
    "ray_kwargs.ray_init",
    "transfer_queue",
    "actor_rollout_ref.rollout.engine_kwargs.vllm",
)  # fmt: skip  (the last: vLLM's own engine arguments)


def _leaves(node: Any, prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        out += _leaves(v, path + ".") if isinstance(v, dict) and v else [path]
    return out


def _verl_knows(verl: Any, key: str) -> bool:
    """``key`` is in VERL's composed yaml (``???`` values included), or its first unknown part is a field of
    the dataclass that the nearest ``_target_`` above it builds (e.g. ``rollout.enable_sleep_mode``, or
    ``fsdp_config.mixed_precision``, a free dict)."""
    import dataclasses
    import importlib

    node, target = verl, None
    for part in key.split("."):
        target = node.get("_target_", target) if hasattr(node, "get") else target
        if not hasattr(node, "keys") or part not in node.keys():  # noqa: SIM118 (a ??? value is not "in" it)
            if target is None:
                return False
            module, _, name = str(target).rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            return part in {f.name for f in dataclasses.fields(cls)}
        node = node._get_node(part)
    return True


@pytest.mark.parametrize("profile", ["gpu", "cpu-smoke"])
def test_every_key_of_the_phase_configs_is_one_verl_knows(env: None, profile: str) -> None:  # noqa: F811
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from trainer.phases.launch import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        verl = compose("ppo_trainer")
    files = [CONFIG_DIR / "grpo_base.yaml", CONFIG_DIR / "profile" / f"{profile}.yaml"]
    files += [CONFIG_DIR / f"{ph}_grpo.yaml" for ph in ("b1", "b2", "c1", "c2")]
    ours = [OmegaConf.to_container(OmegaConf.load(f), resolve=False) for f in files]
    unknown = set()
    for cfg in ours:
        for key in _leaves(cfg):
            if key.split(".")[0] in OWN_BLOCKS | {"defaults", "hydra"} or key.startswith(OPEN_IN_VERL):
                continue
            if not _verl_knows(verl, key):
                unknown.add(key)
    assert not unknown, f"keys VERL 0.9.1's ppo_trainer does not have: {sorted(unknown)}"


@pytest.mark.parametrize("phase", ["b1", "b2", "c1", "c2"])
def test_cpu_smoke_keeps_its_toy_sizes(env: None, phase: str) -> None:  # noqa: F811
    c = composed(f"{phase}_grpo", "profile=cpu-smoke")
    assert c.data.max_response_length == 128 and c.actor_rollout_ref.rollout.n == 2
    assert "tensorboard" not in c.trainer.logger


@pytest.mark.parametrize("phase", ["a1", "a2"])
def test_sft_gpu_is_the_recipe_chosen_on_validation(env: None, phase: str) -> None:  # noqa: F811
    c = composed(f"{phase}_sft", "sft_profile=gpu")
    assert c.optim.lr == pytest.approx(2e-4) and c.optim.lr_scheduler_type == "cosine"
    assert c.trainer.total_epochs == 3 and c.data.train_batch_size == 128 and c.epoch_selection.enabled is True
    assert c.data.train_batch_size % c.data.micro_batch_size_per_gpu == 0 and c.data.micro_batch_size_per_gpu == 64
    assert composed(f"{phase}_sft", "sft_profile=cpu-smoke").epoch_selection.enabled is False
    assert c.model.override_config.attn_implementation == "packed_sdpa" and c.model.use_remove_padding is True
    assert c.data.use_dynamic_bsz is True and c.data.max_token_len_per_gpu == 32768
    assert c.model.enable_gradient_checkpointing is False
    assert "tensorboard" in c.trainer.logger


def test_tensorboard_writes_under_the_phase_folder(tmp_path: object) -> None:
    from pathlib import Path

    from trainer.phases.launch import PhaseRun
    from trainer.registry.phases import get_phase

    out = Path(str(tmp_path)) / "c1"
    run = PhaseRun(get_phase("c1"), "gpu", Path("/data"), out, "/m", reward_url="http://127.0.0.1:1")
    assert run.env({})["TENSORBOARD_DIR"] == str((out / "tensorboard").resolve())


def _verl_validate(c: Any, model_dir: Path) -> None:
    """As ``verl_main`` does: sizing fills the null micro batches from the model's config.json, then VERL checks."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from tests.trainer.phases.test_sizing import write_model_config
    from trainer.phases import sizing

    write_model_config(model_dir)
    with open_dict(c):
        c.actor_rollout_ref.model.path = str(model_dir)
    sizing.apply(c)
    validate_config(config=c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))


@pytest.mark.verl
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_verl_accepts_the_recipe_and_the_positive_control(env: None, gpus: int, tmp_path: Path) -> None:  # noqa: F811
    """VERL's own config checks (``main_ppo`` runs them first: batch divisibility per GPU, clip and loss keys)."""
    from trainer.checks.positive_control import ControlConfig, control_run

    for phase in ("b1", "b2", "c1", "c2"):
        _verl_validate(composed_command(gpu_run(phase, f"trainer.n_gpus_per_node={gpus}")), tmp_path / "m")
        ctl = control_run(get_phase(phase), "gpu", tmp_path / "i.parquet", tmp_path / "o", "/m", "http://r",
                          ControlConfig(), (f"trainer.n_gpus_per_node={gpus}",))  # fmt: skip
        _verl_validate(composed_command(ctl), tmp_path / "m")
    # and they can fail: VERL rejects a train batch below the mini batch and an unknown loss aggregation
    # (it instantiates the actor's config dataclass); the micro-batch split per GPU is test_grpo_gpu_recipe's.
    # VERL checks the batch sizes only for micro batches by count (micro batches by tokens skip that check).
    padded = ("data.train_batch_size=4", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    with pytest.raises(ValueError, match=r"train_batch_size \(4\) must be >= actor.ppo_mini_batch_size \(8\)"):
        _verl_validate(composed_command(gpu_run("b1", *padded)), tmp_path / "m")
    with pytest.raises(Exception, match="Invalid loss_agg_mode: foo"):
        _verl_validate(composed_command(gpu_run("b1", "actor_rollout_ref.actor.loss_agg_mode=foo")), tmp_path / "m")


def _script_array(script: Path, name: str) -> list[str]:
    """A bash array's words, as ``NAME=(...)`` in the script (one array, no expansions in it)."""
    import re
    import shlex

    m = re.search(rf"^{name}=\((.*?)\)$", script.read_text(), re.S | re.M)
    assert m, f"{script}: no {name}=(...) array"
    return shlex.split(m.group(1), comments=True)


def test_the_speed_benchmarks_padded_overrides_give_the_padded_recipe(env: None) -> None:  # noqa: F811
    """``scripts/gpu_node/rl_step.sh`` runs "padded" as the gpu profile on padded micro batches (its setting before
    packing): sdpa, no padding removal, micro batches by count, and nothing else changes."""
    from trainer.phases.launch import REPO_ROOT

    padded = _script_array(REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh", "PADDED")
    c = composed_command(gpu_run("c1", *padded))
    model = c.actor_rollout_ref.model
    assert model.use_remove_padding is False and model.override_config.attn_implementation == "sdpa"
    assert c.actor_rollout_ref.actor.use_dynamic_bsz is False
    after = composed_command(gpu_run("c1"))
    changed = {k for k in _leaves(_container(after)) if _get(after, k) != _get(c, k)}
    # and the keys VERL's config interpolates from those three
    derived = {"actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
               "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz"}  # fmt: skip
    assert changed == {k.split("=")[0] for k in padded} | derived


def test_the_speed_benchmarks_workers_overrides_set_existing_keys(env: None) -> None:  # noqa: F811
    """``rl_step.sh``'s WORKERS row doubles VERL's agent-loop and reward-loop workers (keys VERL's config has)."""
    from trainer.phases.launch import REPO_ROOT

    workers = _script_array(REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh", "WORKERS")
    c, base = composed_command(gpu_run("b1", *workers)), composed_command(gpu_run("b1"))
    assert c.actor_rollout_ref.rollout.agent.num_workers == 2 * base.actor_rollout_ref.rollout.agent.num_workers == 16
    assert c.reward.num_workers == 2 * base.reward.num_workers == 8


def test_the_speed_benchmarks_scheduler_fused_and_verl_path_rows_set_what_they_name(env: None) -> None:  # noqa: F811
    """``rl_step.sh``'s VERLSCHED row puts vLLM's scheduler back as VERL sizes it (256 / 8,192, synchronous, streaming
    every token) and changes nothing else; its FUSED row turns on VERL's fused kernels (torch backend); its VERLPATH
    row turns off what trainer/in_verl/agent_loop_speed.py takes off VERL's per-sample path, nothing else."""
    from trainer.phases.launch import REPO_ROOT

    script = REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh"
    base = composed_command(gpu_run("b1"))
    verl_sched = _script_array(script, "VERLSCHED")
    c = composed_command(gpu_run("b1", *verl_sched))
    rollout = c.actor_rollout_ref.rollout
    assert (rollout.max_num_seqs, rollout.max_num_batched_tokens) == (256, 8192)
    assert rollout.engine_kwargs.vllm.async_scheduling is False and rollout.engine_kwargs.vllm.stream_interval == 1
    assert _changed(base, c) == {k.split("=")[0] for k in verl_sched}
    fused = _script_array(script, "FUSED")
    c = composed_command(gpu_run("b1", *fused))
    assert c.actor_rollout_ref.model.use_fused_kernels is True
    assert c.actor_rollout_ref.model.fused_kernel_options.impl_backend == "torch"
    assert not base.actor_rollout_ref.model.use_fused_kernels
    assert base.agent_loop_speed.reuse_single_turn and base.agent_loop_speed.reward_in_process
    verl_path = _script_array(script, "VERLPATH")
    c = composed_command(gpu_run("b1", *verl_path))
    assert _changed(base, c) == {k.split("=")[0] for k in verl_path}
    assert not c.agent_loop_speed.reuse_single_turn and not c.agent_loop_speed.reward_in_process
    assert base.agent_loop_speed.token_only_outputs and not c.agent_loop_speed.token_only_outputs


def test_the_profile_runs_vllms_model_in_its_engine_process_and_the_multiproc_row_only_undoes_it(
    env: None,  # noqa: F811
) -> None:
    """The gpu profile asks for vLLM's uni executor (VERL asks for "mp"; its server passes engine_kwargs.vllm after
    its own arguments, so the profile's value is the one vLLM gets); ``rl_step.sh``'s MULTIPROC row changes that
    one setting back, nothing else."""
    from trainer.phases.launch import REPO_ROOT

    multiproc = _script_array(REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh", "MULTIPROC")
    base, c = composed_command(gpu_run("b1")), composed_command(gpu_run("b1", *multiproc))
    assert base.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "uni"
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend == "mp"
    assert _changed(c, base) == {"actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"}


def _changed(base: Any, c: Any) -> set[str]:
    return {k for k in _leaves(_container(base)) if _get(base, k) != _get(c, k)}


def _container(c: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(c, resolve=True)


def _get(c: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(c, key)


def test_the_speed_benchmark_waits_only_for_its_own_jobs() -> None:
    """A bare ``wait`` in ``rl_step.sh`` waits for every child of the script, nvidia-smi's sampler included, which
    runs until the script ends: the waves after the first profiled run would never start."""
    import re

    from trainer.phases.launch import REPO_ROOT

    text = (REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh").read_text()
    code = [line.split("#", 1)[0] for line in text.splitlines()]
    bare = [i + 1 for i, line in enumerate(code) if re.search(r"(^|[;&|]\s*|\bthen\s+)wait\s*($|;)", line.strip())]
    assert not bare, f"rl_step.sh: bare `wait` on lines {bare}"
    assert re.search(r'wait "\$spy"', text)


def test_every_default_wave_of_the_speed_benchmark_is_a_function_and_every_wave_is_documented() -> None:
    """``rl_step.sh`` runs the waves in the order WAVES names them, each a ``wave_NAME`` function; its header lists
    every one (an unknown name stops the script before anything runs)."""
    import re

    from trainer.phases.launch import REPO_ROOT

    text = (REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh").read_text()
    defaults = re.search(r"WAVES=\$\{WAVES:-([a-z0-9,]+)\}", text)
    assert defaults, "rl_step.sh: no default WAVES"
    waves = defaults.group(1).split(",")
    functions = re.findall(r"^wave_([a-z0-9]+)\(\)", text, re.M)
    assert set(waves) <= set(functions), f"rl_step.sh: default waves without a function: {set(waves) - set(functions)}"
    header = [line for line in text.splitlines() if line.startswith("#")]
    for wave in functions:
        assert any(re.match(rf"#\s+{wave}\s", line) for line in header), f"rl_step.sh: wave {wave} not in the header"


def test_the_verlbatch_row_leaves_out_only_speedups_the_launcher_knows() -> None:
    """``rl_step.sh``'s verlbatch row measures B1 without the update's gathers: the names it sets must be ones the
    launcher accepts (an unknown one would fail the row on the node, after its start-up)."""
    import re

    from trainer.phases.launch import REPO_ROOT, SPEEDUPS, speedups_off

    text = (REPO_ROOT / "scripts" / "gpu_node" / "rl_step.sh").read_text()
    names = re.findall(r"TRAINER_SPEEDUPS_OFF=([\w,]+) rl b1_verlbatch", text)
    assert names and speedups_off(names[0]) == set(SPEEDUPS.values())


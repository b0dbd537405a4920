"""Phase configs and launchers: composed configs hold the keys the design requires, commands and env."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.phases.export import ExportError, check_hf_dir, drop_attn_implementation, fsdp_dir, merge_command
from trainer.phases.launch import (
    ALWAYS_LOADED,
    CONFIG_DIR,
    CPU_ENV,
    RAY_WORKER_NICENESS,
    REPO_ROOT,
    PhaseResult,
    PhaseRun,
    check_profile,
    read_result,
)
from trainer.registry.phases import PHASES, get_phase
from trainer.serving.reward_api_env import (
    CLIENT_TOKEN_ENV,
    CLIENT_URL_ENV,
    TRAINER_TOKEN_ENV,
    TRAINER_URL_ENV,
    env_name,
)

ENV = {
    "TRAINER_DATA_DIR": "/data",
    "TRAINER_OUT_DIR": "/out",
    "TRAINER_REPO_ROOT": str(REPO_ROOT),
    "POLICY_MODEL_PATH": "/models/start",
    "TRAINER_REWARD_URL": "http://127.0.0.1:8123",  # what the launcher hands VERL (test_reward_env_of_a_launch)
}


@pytest.fixture
def env() -> Iterator[None]:
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def composed(name: str, *overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(name, overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize("phase", ["b1", "b2", "c1", "c2"])
@pytest.mark.parametrize("profile", ["gpu", "cpu-smoke"])
def test_grpo_configs(env: None, phase: str, profile: str) -> None:
    c = composed(f"{phase}_grpo", f"profile={profile}")
    arr = c.actor_rollout_ref
    assert c.algorithm.adv_estimator == "grpo_masked"  # VERL's GRPO over the samples with a gradient
    assert c.data.train_files == f"/data/{phase}/train.parquet"
    assert c.data.val_files == f"/data/{phase}/validation.parquet"
    assert arr.model.path == "/models/start"
    # KL off by default (no reference pass); a user who turns it on gets low_var_kl at a positive coefficient
    assert arr.actor.use_kl_loss is False and arr.actor.kl_loss_type == "low_var_kl" and arr.actor.kl_loss_coef > 0
    assert arr.actor.strategy == "fsdp2" and arr.ref.strategy == "fsdp2"
    # the reward function is configured under reward.* (the top-level key is silently ignored)
    assert c.reward.custom_reward_function.path == f"{REPO_ROOT}/trainer/in_verl/reward_fn.py"
    assert c.reward.custom_reward_function.name == "compute_score"
    assert c.reward.custom_reward_function.reward_kwargs.url == "http://127.0.0.1:8123"
    assert c.get("custom_reward_function") is None or c.custom_reward_function.path is None
    assert c.trainer.save_freq == c.trainer.test_freq > 0
    # exactly VERL's "sync": any other name switches VERL onto its async sampler and batch sizes
    assert c.trainer.v1.trainer_mode == "sync"
    # mask mode in every profile (the demo's cpu-smoke included): an infrastructure failure is never trained on;
    # the client is told through its own key. Only the CPU smokes opt in to penalize, by name.
    assert c.failures.mode == c.reward.custom_reward_function.reward_kwargs.failure_mode == "mask"
    assert c.failures.max_share == 0.1
    assert (
        c.reward.custom_reward_function.reward_kwargs.failure_log
        == f"{c.trainer.default_local_dir}/reward_failures.jsonl"
    )
    assert c.phase.name == phase
    assert c.early_stopping.data_source == get_phase(phase).reward
    if profile == "cpu-smoke":
        assert c.trainer.device == "cpu" and c.trainer.n_gpus_per_node == 1
        for role in (arr.actor, arr.ref):
            assert role.fsdp_config.mixed_precision.param_dtype == "fp32"
        assert arr.rollout.dtype == "float32" and arr.rollout.enforce_eager and not arr.rollout.enable_sleep_mode
        assert arr.model.use_remove_padding is False and arr.model.override_config.attn_implementation == "sdpa"
        assert c.ray_kwargs.ray_init._node_ip_address == "127.0.0.1" and c.ray_kwargs.ray_init.num_gpus == 1
        assert c.reward.num_workers == 1
        assert c.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    else:
        assert c.trainer.device == "cuda" and c.trainer.n_gpus_per_node == 8
        assert arr.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
        assert "_node_ip_address" not in c.ray_kwargs.ray_init
        assert c.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1  # the start waited on 8


def test_early_stopping_metrics_per_phase(env: None) -> None:
    assert dict(composed("b1_grpo").early_stopping.metrics) == {"f1": 1.0, "valid_json": 0.25}
    assert dict(composed("b2_grpo").early_stopping.metrics) == {"table_score": 1.0}
    assert dict(composed("c1_grpo").early_stopping.metrics) == {"reward": 1.0}
    assert dict(composed("c2_grpo").early_stopping.metrics) == {"table_score": 1.0}


@pytest.mark.parametrize("phase", ["a1", "a2"])
@pytest.mark.parametrize("profile", ["gpu", "cpu-smoke"])
def test_sft_configs(env: None, phase: str, profile: str) -> None:
    c = composed(f"{phase}_sft", f"sft_profile={profile}")
    assert c.data.train_files == f"/data/{phase}/train.parquet" and c.data.messages_key == "messages"
    assert c.model.path == "/models/start" and c.engine.strategy == "fsdp2"
    want = "fp32" if profile == "cpu-smoke" else "bf16"
    assert c.engine.mixed_precision.param_dtype == want
    if profile == "cpu-smoke":
        assert c.data.pad_mode == "no_padding"


def test_cli_override_wins(env: None) -> None:
    c = composed("c1_grpo", "profile=cpu-smoke", "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=1")
    assert c.actor_rollout_ref.rollout.n == 4 and c.trainer.total_training_steps == 1


def test_phase_run_command_and_env(tmp_path: Path) -> None:
    run = PhaseRun(get_phase("c1"), "cpu-smoke", tmp_path / "d", tmp_path / "o", "/m", "http://r", ("a.b=1",))
    cmd = run.command()
    assert cmd[1:] == ["-m", "trainer.in_verl.verl_main", "--config-name", "c1_grpo", "profile=cpu-smoke", "a.b=1"]
    env = run.env({"PATH": "/bin"})
    for k, v in CPU_ENV.items():
        assert env[k] == (f"{v},{','.join(ALWAYS_LOADED)}" if k == "VERL_USE_EXTERNAL_MODULES" else v)
    assert env["TRAINER_REWARD_URL"] == "http://r" and env["POLICY_MODEL_PATH"] == "/m"
    assert env["TRAINER_DATA_DIR"] == str((tmp_path / "d").resolve())
    assert env["VERL_FILE_LOGGER_PATH"] == str((tmp_path / "o" / "metrics.jsonl").resolve())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
    sft = PhaseRun(get_phase("a2"), "gpu", tmp_path, tmp_path, "/m", nproc=8).command()
    assert "verl.trainer.sft_trainer" in sft and "--nproc_per_node=8" in sft and "sft_profile=gpu" in sft
    assert sft[sft.index("--config-path") + 1] == str(CONFIG_DIR)
    off = run.env({"PATH": "/bin", "TRAINER_SPEEDUPS_OFF": "nested_batches"})["VERL_USE_EXTERNAL_MODULES"]
    assert "trainer.in_verl.nested_batches" not in off and "trainer.in_verl.response_padding" in off


def test_ray_workers_of_a_phase_run_at_niceness_0_unless_the_caller_says_otherwise(tmp_path: Path) -> None:
    for profile in ("cpu-smoke", "gpu"):
        run = PhaseRun(get_phase("b1"), profile, tmp_path, tmp_path, "/m", "http://r")  # type: ignore[arg-type]
        assert run.env({"PATH": "/bin"})["RAY_worker_niceness"] == "0"
        assert run.env({"PATH": "/bin", "RAY_worker_niceness": "5"})["RAY_worker_niceness"] == "5"


@pytest.mark.slow  # two local Ray instances
def test_ray_honours_the_worker_niceness_a_phase_sets() -> None:
    """Ray's own default niceness for workers is 15; with the phase's variable its workers run at 0."""
    import subprocess
    import sys

    code = (
        "import os, ray; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
        "print(ray.get(ray.remote(lambda: os.nice(0)).remote())); ray.shutdown()"
    )
    seen = {}
    for value in (None, RAY_WORKER_NICENESS[1]):
        env = {k: v for k, v in os.environ.items() if k != RAY_WORKER_NICENESS[0]}
        if value is not None:
            env[RAY_WORKER_NICENESS[0]] = value
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        seen[value] = int(res.stdout.strip().splitlines()[-1]) - os.nice(0)
    assert seen == {None: 15, "0": 0}, seen


def test_grpo_run_needs_a_reward_url(tmp_path: Path) -> None:
    run = PhaseRun(get_phase("b1"), "gpu", tmp_path, tmp_path, "/m")
    with pytest.raises(ValueError, match=f"phase b1: {CLIENT_URL_ENV} is not set"):
        run.env({})
    with pytest.raises(ValueError, match=CLIENT_URL_ENV):  # the launcher's own name is no way in
        run.env({TRAINER_URL_ENV: "http://stale"})
    PhaseRun(get_phase("a1"), "gpu", tmp_path, tmp_path, "/m").env({})  # SFT needs none


def test_reward_env_of_a_launch(tmp_path: Path) -> None:
    """The user sets REWARD_API_URL/_TOKEN (or --reward-url); VERL's processes get TRAINER_REWARD_URL/_TOKEN,
    and the composed GRPO config reads the URL from there."""
    user = {CLIENT_URL_ENV: "http://user:1", CLIENT_TOKEN_ENV: "tok"}
    run = PhaseRun(get_phase("c1"), "gpu", tmp_path / "d", tmp_path / "o", "/m")
    env = run.env(user)
    assert env[TRAINER_URL_ENV] == "http://user:1" and env[TRAINER_TOKEN_ENV] == "tok"
    flag = PhaseRun(get_phase("c1"), "gpu", tmp_path / "d", tmp_path / "o", "/m", "http://flag:2")
    assert flag.env(user)[TRAINER_URL_ENV] == "http://flag:2"  # --reward-url wins
    # no token: none passed on, and a stale one inherited from the caller's environment is dropped
    stale = {CLIENT_URL_ENV: "http://user:1", TRAINER_URL_ENV: "http://old", TRAINER_TOKEN_ENV: "old"}
    env = run.env(stale)
    assert env[TRAINER_URL_ENV] == "http://user:1" and TRAINER_TOKEN_ENV not in env
    old = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(run.env(user))
        cfg = composed("c1_grpo", "profile=gpu")
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert cfg.reward.custom_reward_function.reward_kwargs.url == "http://user:1"


def test_the_in_verl_client_reads_the_names_the_launcher_sets() -> None:
    """trainer/in_verl may not import trainer.serving, so it spells the launcher's names: they must agree."""
    from trainer.in_verl import reward_batcher

    assert (reward_batcher.URL_ENV, reward_batcher.TOKEN_ENV) == (TRAINER_URL_ENV, TRAINER_TOKEN_ENV)
    assert env_name("token") == CLIENT_TOKEN_ENV  # the trainer sends the token the service reads


def test_bad_phase_and_profile_are_named() -> None:
    with pytest.raises(ValueError, match="phase must be one of"):
        get_phase("d")
    with pytest.raises(ValueError, match="--profile"):
        check_profile("tpu")
    assert set(PHASES) == {"a1", "a2", "b1", "b2", "c1", "c2"}


def test_result_roundtrip(tmp_path: Path) -> None:
    res = PhaseResult("b1", "cpu-smoke", "ok", 0, ["x"], "/m", "/d", str(tmp_path), "t", 1.0, best_step=3)
    res.write(tmp_path)
    back = read_result(tmp_path)
    assert back is not None and back.best_step == 3 and back.status == "ok"
    # written whole or not at all (a watcher waits for the file): no temporary file is left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phase_result.json"]


def test_export_helpers(tmp_path: Path) -> None:
    step = tmp_path / "global_step_3"
    (step / "actor").mkdir(parents=True)
    assert fsdp_dir(step, "grpo") == step / "actor"
    with pytest.raises(ExportError, match="no actor/"):
        fsdp_dir(tmp_path / "global_step_9", "grpo")
    assert fsdp_dir(tmp_path / "global_step_9", "sft") == tmp_path / "global_step_9"
    cmd = merge_command(step / "actor", tmp_path / "hf")
    assert cmd[1:5] == ["-m", "verl.model_merger", "merge", "--backend"] and "--target_dir" in cmd
    hf = tmp_path / "hf"
    hf.mkdir()
    with pytest.raises(ExportError, match=r"config\.json, weights"):
        check_hf_dir(hf)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (hf / f).write_text("{}")
    check_hf_dir(hf)


def test_an_export_names_no_training_attention(tmp_path: Path) -> None:
    """VERL writes the phase's attention (packed_sdpa, registered only inside a phase) into the checkpoint's
    config.json; a process without it (the merger, vLLM, transformers elsewhere) refuses that config until the
    export drops the key."""
    import json
    import subprocess
    import sys

    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    raw = json.loads(config.read_text()) | {"attn_implementation": "packed_sdpa"}
    config.write_text(json.dumps(raw))
    load = [sys.executable, "-c", f"from transformers import AutoModelForCausalLM as A, AutoConfig as C; "
            f"A.from_config(C.from_pretrained({str(tmp_path)!r}))"]  # fmt: skip
    refused = subprocess.run(load, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode != 0 and "packed_sdpa" in refused.stderr
    assert drop_attn_implementation(config) is True
    assert "attn_implementation" not in config.read_text() and not list(tmp_path.glob("*.tmp"))
    assert subprocess.run(load, capture_output=True, text=True, timeout=300, check=False).returncode == 0
    assert drop_attn_implementation(config) is False and drop_attn_implementation(tmp_path / "absent.json") is False


@pytest.mark.parametrize(
    ("name", "path"),
    [("b2_grpo", ("table_config",)), ("c2_grpo", ("table_config",)), ("c1_grpo", ("pipeline_config", "table_reward"))],
)
def test_table_phases_spell_out_the_default_table_metric(env: None, name: str, path: tuple[str, ...]) -> None:
    """B2, C2 and C1's table part train on the aligned metric (docs/rewards.md)."""
    node = composed(name).reward.custom_reward_function.reward_kwargs
    for key in path:
        node = node[key]
    assert node["table_metric"] == "aligned"


def test_a_token_override_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A token as a reward_kwargs override would be written to command.sh, phase_result.json and VERL's config
    log; the launch refuses it by name, before any file exists."""
    name = "reward.custom_reward_function.reward_kwargs.token"
    for key in (f"+{name}", name):
        with pytest.raises(ValueError, match=r"reward_kwargs\.token\); set the reward API token in the environment"):
            PhaseRun(get_phase("c1"), "gpu", tmp_path, tmp_path / "c1", "/m", "http://r", (f"{key}=s3cret",))
    assert not (tmp_path / "c1").exists()

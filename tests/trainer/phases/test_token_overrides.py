"""trainer/phases/token_overrides.py: an override that sets a reward API token under reward_kwargs, in any form
Hydra accepts, is refused by one line naming where, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.phases.token_overrides import TokenInOverrideError, check_no_token, token_key

SECRET = "s3cret-Tok3n"
RK = "reward.custom_reward_function.reward_kwargs"

# (override, the key path the refusal names)
SETS_A_TOKEN = [
    (f"{RK}.token={SECRET}", f"{RK}.token"),
    (f"+{RK}.token={SECRET}", f"{RK}.token"),
    (f"++{RK}.token={SECRET}", f"{RK}.token"),
    (f"~{RK}.token={SECRET}", f"{RK}.token"),
    (f"~{RK}.token", f"{RK}.token"),
    (f"{RK}.Token={SECRET}", f"{RK}.Token"),
    (f"{RK}.TOKEN={SECRET}", f"{RK}.TOKEN"),
    (f"{RK}.api_token={SECRET}", f"{RK}.api_token"),
    (f"{RK}.token='{SECRET}'", f"{RK}.token"),
    (f'{RK}.token="{SECRET} with spaces"', f"{RK}.token"),
    (f"{RK}.token=${{oc.env:TRAINER_REWARD_TOKEN}}", f"{RK}.token"),  # resolved into VERL's config dump
    (f"{RK}={{token: {SECRET}}}", f"{RK}.token"),
    (f"{RK}={{url: 'http://r:1', Token: {SECRET}}}", f"{RK}.Token"),
    (f"++{RK}={{token: {SECRET}}}", f"{RK}.token"),
    (f"+{RK}={{token:{SECRET}}}", f"{RK}.token"),
    (f"{RK}={{pipeline_config: {{token: {SECRET}}}}}", f"{RK}.pipeline_config.token"),
    (f"{RK}=[{{token: {SECRET}}}]", f"{RK}.0.token"),
    (f"{RK}='{{token: {SECRET}}}'", f"{RK}.token"),  # a quoted dict: a string the YAML of which sets it
    (f'{RK}.pipeline_config=\'{{"token": "{SECRET}"}}\'', f"{RK}.pipeline_config.token"),  # JSON in a string
    (f"reward={{custom_reward_function: {{reward_kwargs: {{token: {SECRET}}}}}}}", f"{RK}.token"),
    (f"reward.custom_reward_function={{reward_kwargs: {{token: {SECRET}}}}}", f"{RK}.token"),
    (f"reward_kwargs.token={SECRET}", "reward_kwargs.token"),  # anywhere in the key path
    (f"a.Reward_Kwargs.token={SECRET}", "a.Reward_Kwargs.token"),
    (f"{RK}.token={SECRET},other", f"{RK}.token"),  # a sweep
    (f'{RK}={{"token": {SECRET}}}', "(an override Hydra cannot parse, naming reward_kwargs and a token)"),
]

LEGITIMATE = [
    f"{RK}.max_batch=8",
    f"{RK}.pipeline_config={{table_reward: {{table_metric: aligned}}}}",
    f"{RK}.url=http://127.0.0.1:9",
    f"{RK}.max_tokens=512",
    f"{RK}.reward_model_tokenizer=/m",
    "actor_rollout_ref.rollout.response_length=256",
    "+token_budget=3",  # not under reward_kwargs: never sent to the reward API
    "data.train_files=/tmp/p-1/b1_people.parquet",
    "trainer.total_training_steps=4",
]


@pytest.mark.parametrize(("override", "path"), SETS_A_TOKEN)
def test_every_form_that_sets_a_token_is_refused(override: str, path: str) -> None:
    assert token_key(override) == path
    with pytest.raises(TokenInOverrideError) as err:
        check_no_token(("x=1", override), "phase c1")
    message = str(err.value)
    assert message.startswith(f"phase c1: override 2 of 2 sets a reward API token ({path}); set the reward API token "
                              "in the environment instead ($REWARD_API_TOKEN; `trainer run` passes it to VERL's "
                              "processes as $TRAINER_REWARD_TOKEN)")  # fmt: skip
    assert "\n" not in message and SECRET not in message


@pytest.mark.parametrize("override", LEGITIMATE)
def test_other_overrides_pass(override: str) -> None:
    assert token_key(override) is None
    check_no_token((override,), "phase c1")


def test_the_launch_refuses_before_anything_is_written(tmp_path: Path) -> None:
    from trainer.phases.launch import PhaseRun
    from trainer.registry.phases import get_phase

    for override, _path in SETS_A_TOKEN:
        with pytest.raises(TokenInOverrideError, match=r"^phase c1: override 1 of 1 sets a reward API token"):
            PhaseRun(get_phase("c1"), "gpu", tmp_path, tmp_path / "c1", "/m", "http://r", (override,))
    assert not (tmp_path / "c1").exists()


def test_the_run_configs_refuse_before_the_run_record_is_written(tmp_path: Path) -> None:
    from tests.trainer.runs.test_loop import SAMPLE
    from trainer.runs.config import ExperimentConfig, LoopConfig

    override = f"++{RK}={{token: {SECRET}}}"
    for field, where in (("rl_extra", "--rl-extra"), ("sft_overrides", "--sft-override")):
        with pytest.raises(TokenInOverrideError, match=rf"^{where}"):
            LoopConfig(golden=SAMPLE, out=tmp_path / "loop", **{field: ("x=1", override)})
        with pytest.raises(TokenInOverrideError, match=rf"^{where}"):
            ExperimentConfig(golden=SAMPLE, out=tmp_path / "exp", **{field: (override,)})
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("command", "where"),
    [
        (["run", "c1", "--profile", "gpu", "--model", "/m", "--reward-url", "http://r:1", "--out", "{out}"],
         "trainer run c1"),
        (["loop", "--golden", "{sample}", "--out", "{out}", "--profile", "cpu-smoke", "--pi1-sft", "/a",
          "--pi2-sft", "/b"], "--rl-extra (and the overrides after the options)"),
    ],
    ids=["run", "loop"],
)  # fmt: skip
def test_the_commands_print_one_line_and_write_nothing(tmp_path: Path, command: list[str], where: str) -> None:
    from typer.testing import CliRunner

    from tests.trainer.runs.test_loop import SAMPLE
    from trainer.cli import app

    out = tmp_path / "out"
    args = [a.format(out=out, sample=SAMPLE) for a in command]
    res = CliRunner().invoke(app, [*args, f"++{RK}={{token: {SECRET}}}"], env={"COLUMNS": "400"})
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.stderr.splitlines() == [
        f"error: {where}: override 1 of 1 sets a reward API token ({RK}.token); set the reward API token in the "
        "environment instead ($REWARD_API_TOKEN; `trainer run` passes it to VERL's processes as "
        "$TRAINER_REWARD_TOKEN): an override is written to command.sh, phase_result.json, run.json and VERL's config "
        "dump in train.log"
    ]
    assert SECRET not in res.output and not out.exists()


def test_the_config_verl_dumps_holds_no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """VERL prints every phase's config resolved into train.log: with the token in the environment, no phase's
    composed config (every profile) interpolates it, so the dump cannot hold it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from trainer.phases.launch import CONFIG_DIR, PROFILES
    from trainer.registry.phases import PHASES, get_phase

    for name, value in {"TRAINER_DATA_DIR": "/d", "TRAINER_OUT_DIR": "/o", "TRAINER_REPO_ROOT": "/r",
                        "POLICY_MODEL_PATH": "/m", "TRAINER_REWARD_URL": "http://r:1",
                        "TRAINER_REWARD_TOKEN": SECRET}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in PHASES:
        phase = get_phase(name)
        for profile in PROFILES:
            choice = f"{'profile' if phase.kind == 'grpo' else 'sft_profile'}={profile}"
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
                cfg = compose(phase.config_name, overrides=[choice])
            dump = OmegaConf.to_yaml(cfg, resolve=True)
            assert "reward_kwargs" in dump or phase.kind == "sft"
            assert SECRET not in dump, (name, profile)


@pytest.mark.verl
@pytest.mark.slow  # VERL's entry point starts (about a minute on 2 cores): run it under `flock /tmp/heavy.lock`
def test_no_file_a_launch_writes_holds_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real C1 launch (cpu-smoke) with the token in the user's variable: VERL's entry point starts, composes the
    config and stops at the missing train set. Every file it and the launcher wrote (command.sh, train.log,
    phase_result.json, Hydra's run folder) is searched for the token; VERL's processes had it in their
    environment."""
    from trainer.phases.launch import PhaseRun, run_phase
    from trainer.registry.phases import get_phase
    from trainer.serving.reward_api_env import CLIENT_TOKEN_ENV, TRAINER_TOKEN_ENV

    monkeypatch.setenv(CLIENT_TOKEN_ENV, SECRET)
    out = tmp_path / "c1"
    run = PhaseRun(get_phase("c1"), "cpu-smoke", tmp_path / "no_data", out, str(tmp_path / "no_model"),
                   "http://127.0.0.1:9", overrides=(f"hydra.run.dir={out / 'hydra'}",))  # fmt: skip
    assert run.env()[TRAINER_TOKEN_ENV] == SECRET
    res = run_phase(run, export=False)
    assert res.status == "failed" and "train.parquet does not exist" in (out / "train.log").read_text()
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {"command.sh", "train.log", "phase_result.json", "hydra/.hydra/config.yaml"} <= set(written), written
    holding = [name for name in written if SECRET.encode() in (out / name).read_bytes()]
    assert holding == []

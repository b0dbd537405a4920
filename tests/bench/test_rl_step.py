"""The before/after report of a GRPO step, an SFT epoch and a start-up (bench/rl_step.py), from a collected
``job.sh`` archive laid out as the node script leaves it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from bench import rl_step

T0 = 1_790_000_000.0  # a run's start (epoch seconds)


def _stamp(t: float) -> str:
    """VERL's log time stamp."""
    d = dt.datetime.fromtimestamp(t, dt.UTC)
    return d.strftime("%Y-%m-%d %H:%M:%S") + f",{int(t * 1000) % 1000:03d}"


def _grpo_run(root: Path, name: str, steps: list[dict[str, float]], gpus: int, first_gen: float) -> None:
    d = root / "rl" / name
    d.mkdir(parents=True)
    cmd = "python -m trainer.in_verl.verl_main --config-name b1_grpo profile=gpu"
    (d / "command.sh").write_text(f"{cmd} trainer.n_gpus_per_node={gpus} trainer.total_training_steps={len(steps)}\n")
    rows = [{"step": i + 1, "data": s} for i, s in enumerate(steps)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "train.log").write_text(f"INFO:{_stamp(T0 + 5)}:Started a local Ray instance\n"
                                 f"INFO:{_stamp(T0 + first_gen)}:Passing raw prompts\n")  # fmt: skip


def _step(step: float, gen: float, old: float, ref: float, upd: float, tokens: float = 3e5, **extra: float) -> dict:
    return {"timing_s/step": step, "timing_s/gen": gen, "timing_s/old_log_prob": old, "timing_s/ref": ref,
            "timing_s/adv": 0.5, "timing_s/update_actor": upd, "timing_s/update_weights": 0.5,
            "perf/total_num_tokens": tokens, "prompt_length/mean": 250.0, "response_length/mean": 35.0,
            **extra}  # fmt: skip


@pytest.fixture
def collected(tmp_path: Path) -> Path:
    root = tmp_path / "collected"
    mism = {"rollout_corr/kl": 7e-5, "training/rollout_probs_diff_mean": 1.1e-3, "actor/ppo_kl": 1.5e-4}
    # before: the first step is a warm-up outlier and is left out of the means
    _grpo_run(root, "b1_before", [_step(60, 20, 4, 4, 10, **mism), _step(25, 6, 4, 4, 10, **mism),
                                  _step(24, 5, 4, 4, 10, **mism)], gpus=2, first_gen=260)  # fmt: skip
    _grpo_run(root, "b1_after", [_step(30, 10, 0, 0, 5), _step(9, 3, 0, 0, 5), _step(9, 3, 0, 0, 5)], 2, 140)
    _grpo_run(root, "c1_before", [_step(40, 15, 4, 4, 10), _step(33, 13, 4, 4, 10)], 2, 270)
    _grpo_run(root, "c1_after", [_step(20, 8, 0, 0, 5), _step(11, 4, 0, 0, 5)], 2, 150)
    # still running when collected: no stages.tsv line, two steps logged
    _grpo_run(root, "b2_before", [_step(66, 11, 5, 5, 18), _step(36, 10, 4, 4, 16)], 2, 250)
    sft = root / "rl" / "a1_after"
    sft.mkdir(parents=True)
    # tqdm's carriage-returned progress: 300 of 1,119 steps in 1:40
    (sft / "train.log").write_text("Epoch 1/1:  10%|█         | 112/1119 [00:37<05:33, 3.0it/s]\r"
                                   "Epoch 1/1:  27%|██▋       | 300/1119 [01:40<04:33, 3.0it/s]\n")  # fmt: skip
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 300, "data": {"train/loss": 0.21, "val/loss": 0.25}}) + "\n")
    (sft / "command.sh").write_text("torchrun ... a1_sft\n")
    jobs = root / "jobs"
    jobs.mkdir()
    names = ["b1_before", "b1_after", "c1_before", "c1_after", "a1_after"]
    jobs.joinpath("stages.tsv").write_text("".join(f"{n}\t{T0}\t{T0 + 400}\t400\n" for n in names) + "api\t1\t2\t1\n")
    for n in names:
        (jobs / f"{n}.rc").write_text("0\n")
    (root / "card.txt").write_text("0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n")
    (root / "versions.json").write_text(json.dumps({"vllm": "0.24.0", "verl": "0.9.1"}))
    (root / "rl" / "runs.json").write_text(json.dumps({"b1_after": {"gpus": "2,3"}, "a1_after": {"gpus": "1"}}))
    lines = []
    for k in range(0, 800):  # every 0.5 s: GPUs 2 and 3 at 80% after the first generation, GPU 1 at 40%
        t = T0 + k * 0.5
        stamp = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        lines += [f"{stamp}, {i}, {(80 if t >= T0 + 140 else 0) if i in (2, 3) else 40}, 1000" for i in range(4)]
    (root / "rl" / "gpu_util.csv").write_text("\n".join(lines) + "\n")
    return root


def test_report_fields_and_values(collected: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(rl_step, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path / "results")
    p = rl_step.run([collected])
    b, a = p["before"]["b1"], p["after"]["b1"]
    assert b["step_s"] == pytest.approx(24.5) and b["first_step_s"] == 60 and b["steps_averaged"] == 2
    assert a["step_s"] == pytest.approx(9.0) and a["split_s"]["gen"] == pytest.approx(3.0)
    # other = step - (gen + old + ref + adv + update + weight sync)
    assert b["split_s"]["other"] == pytest.approx(24.5 - (5.5 + 4 + 4 + 0.5 + 10 + 0.5))
    # the floor: 8 N T / (peak x GPUs)
    floor = 8 * rl_step.SMOLLM2_135M_PARAMS * 3e5 / (989.4e12 * 2)
    assert a["floor_s"] == pytest.approx(floor, abs=1e-3) and p["floor_s"]["b1"] == a["floor_s"]
    assert a["tokens_per_s"] == pytest.approx(3e5 / 9.0, rel=1e-3)
    assert b["startup_s"] == pytest.approx(260) and a["startup_s"] == pytest.approx(140)
    assert p["startup_s"] == pytest.approx(150)  # the slowest after-run's start
    # C1's reward share: its generation beyond B1's at the same settings, over its step
    assert p["after"]["c1"]["reward_share"] == pytest.approx((4 - 3) / 11, abs=1e-3)
    assert p["before"]["c1"]["reward_share"] == pytest.approx((13 - 5.5) / 33, abs=1e-3)
    assert b["mismatch"]["rollout_kl"] == pytest.approx(7e-5) and a["mismatch"]["rollout_kl"] is None
    assert a["busy_share"] == pytest.approx(0.8, abs=0.01)  # GPUs 2,3 from the first generation on
    sft = p["sft"]["a1_after"]
    assert sft["epoch_s"] == pytest.approx(100 * 1119 / 300, abs=0.1) and sft["steps"] == 300
    assert sft["val_loss"] == 0.25 and sft["busy_share"] == pytest.approx(0.4)
    assert p["sft_epoch_s"] == {"a1": sft["epoch_s"]} and "H100" in p["card"]
    b2 = p["before"]["b2"]
    assert b2["unfinished"] is True and b2["step_s"] == 36 and b2["steps_averaged"] == 1 and b2["startup_s"] is None
    assert b["unfinished"] is False
    md = (tmp_path / "results" / "rl_step.md").read_text()
    assert "| b2 | before | 2 | 1 (unfinished) | 36.00 |" in md
    assert "| b1 | before | 2 | 2 | 24.50 |" in md and "reward share" in md and "KL(rollout, actor)" in md
    assert (tmp_path / "results" / "rl_step.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "results" / "rl_step.json").read_text())
    assert saved["after"]["c1"]["reward_share"] == p["after"]["c1"]["reward_share"]
    # another SFT setting's epoch (e.g. a recipe compared by sft_mix.sh): a1_after is not read then
    other = rl_step.run([collected], sft_setting="epochs")
    assert other["sft_epoch_s"] == {} and other["sft_setting"] == "epochs"
    assert other["command"].endswith("--sft-setting epochs")


def test_nothing_collected_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no finished run"):
        rl_step.build([tmp_path])


def test_gpu_count_and_card() -> None:
    assert rl_step.gpus_of("python -m x profile=gpu trainer.n_gpus_per_node=4") == 4
    assert rl_step.gpus_of("python -m x") == 8  # the profile's default
    assert rl_step.card_peak("NVIDIA H200") == rl_step.card_peak("NVIDIA H100 80GB HBM3") == 989.4e12
    assert rl_step.card_peak("Tesla T4") is None and rl_step.floor_s(3e5, 2, None, 1) is None


def test_one_gpu_rows_beside_verl_stock_with_targets(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(rl_step, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path / "results")
    root = tmp_path / "one"
    batch = " data.train_batch_size=64 actor_rollout_ref.rollout.n=16"
    _grpo_run(root, "b1_fast", [_step(20, 9, 0, 0, 6), _step(7, 3, 0, 0, 3), _step(5, 2, 0, 0, 2)], 1, 55)
    _grpo_run(root, "b1_stock", [_step(30, 10, 2, 0, 8), _step(12, 5, 2, 0, 4)], 1, 120)
    _grpo_run(root, "c1_fast", [_step(25, 12, 0, 0, 6), _step(9, 5, 0, 0, 3)], 1, 70)
    for name in ("b1_fast", "b1_stock", "c1_fast"):
        cmd = root / "rl" / name / "command.sh"
        cmd.write_text(cmd.read_text().strip() + batch + "\n")
    for name in ("a1_fast", "a2_fast"):
        sft = root / "rl" / name
        sft.mkdir(parents=True)
        (sft / "train.log").write_text("Epoch 1/1:  36%|███ | 100/280 [00:40<01:12, 2.5it/s]\n")
        (sft / "command.sh").write_text("torchrun ...\n")
    jobs = root / "jobs"
    jobs.mkdir()
    names = ["b1_fast", "b1_stock", "c1_fast", "a1_fast", "a2_fast", "exec_pi2"]
    jobs.joinpath("stages.tsv").write_text("".join(f"{n}\t{T0}\t{T0 + 300}\t{25 if n == 'exec_pi2' else 300}\n"
                                                   for n in names))  # fmt: skip
    for n in names:
        (jobs / f"{n}.rc").write_text("0\n")
    (root / "card.txt").write_text("0, NVIDIA H200, 143771 MiB, 580.159.04\n")
    p = rl_step.run([root])
    rows = {r["name"]: r for r in p["rows"]}
    assert rows["b1_stock"]["setting"] == "verl_stock" and rows["b1_fast"]["setting"] == "fast"
    assert rows["b1_fast"]["step_s"] == pytest.approx(6.0) and rows["b1_fast"]["batch"] == 64
    assert rows["b1_fast"]["n"] == 16 and rows["b1_fast"]["gpus"] == 1 and rows["b1_fast"]["startup_s"] == 55
    assert rows["b1_fast"]["startup_split"][0]["to"] == "ray_started"
    assert rows["c1_fast"]["reward_share"] == pytest.approx((5 - 2.5) / 9, abs=1e-3)
    assert p["executor_ready_s"] == {"pi2": 25.0}
    t = {x["target"]: x for x in p["targets"]}
    assert t["b1_step_s"]["measured"] == 6.0 and t["b1_step_s"]["met"] is True
    assert t["c1_step_s"]["met"] is False and t["c1_step_s"]["largest_part"] == "gen 5.00 s"
    assert t["b1_over_verl_stock"]["measured"] == pytest.approx(0.5) and t["b1_over_verl_stock"]["met"] is True
    assert t["startup_s"]["measured"] == 70 and t["startup_s"]["met"] is False
    assert t["executor_ready_s"]["met"] is True
    assert t["sft_two_epochs_side_by_side_s"]["measured"] == pytest.approx(2 * 40 * 280 / 100, abs=0.2)
    md = (tmp_path / "results" / "rl_step.md").read_text()
    assert "| b1 | verl_stock | 1 | 64 x 16 |" in md and "## Targets (one GPU, 64 x 16)" in md
    assert "| c1_step_s | 8.00 | 9.000 | **no** | gen 5.00 s |" in md


def test_a_run_still_going_is_timed_from_its_job_log_and_an_executor_from_its_first_start(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _grpo_run(root, "b1_stock", [_step(98, 8, 16, 0, 49), _step(78, 6, 20, 0, 50)], 1, 240)
    jobs = root / "jobs"
    jobs.mkdir()
    # an earlier try of the same name failed; the run collected is the second, still going
    # (a start that failed, with its exit status, never served: not an executor's ready time)
    jobs.joinpath("stages.tsv").write_text(f"exec_pi2\t{T0 - 50}\t{T0 - 22}\t28\t1\n"
                                           f"exec_pi2\t{T0}\t{T0 + 97}\t97\t0\nexec_pi2\t{T0 + 500}\t{T0 + 503}\t3\n"
                                           f"b1_stock\t{T0}\t{T0 + 105}\t105\n")  # fmt: skip
    (jobs / "exec_pi2.rc").write_text("0\n")
    start = dt.datetime.fromtimestamp(T0, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    earlier = "=== 2026-01-01T00:00:00Z python3 -m bench.verl_stock\n"
    (jobs / "b1_stock.log").write_text(f"{earlier}=== {start}Z python3 -m bench.verl_stock\n")
    p = rl_step.build([root])
    row = next(r for r in p["rows"] if r["name"] == "b1_stock")
    assert row["unfinished"] is True and row["startup_s"] == pytest.approx(240) and row["step_s"] == 78
    assert p["executor_ready_s"] == {"pi2": 97.0}  # the first start that served; the next found it up
    assert rl_step.job_log_start(jobs / "missing.log") is None


def test_sharing_the_card_is_the_sum_of_the_alone_steps_over_the_slower_paired_step() -> None:
    rows = [
        {"phase": "b1", "setting": "fast", "step_s": 14.0},
        {"phase": "b2", "setting": "fast", "step_s": 12.0},
        {"phase": "b1", "setting": "pair", "step_s": 16.0},
        {"phase": "b2", "setting": "pair", "step_s": 20.0},
    ]
    assert rl_step.shared_card(rows) == {"in_turn_s": 26.0, "side_by_side_s": 20.0, "gain": 1.3}
    assert rl_step.shared_card(rows[:3]) is None  # B2's paired row missing
    md = rl_step.rows_md({"rows": [], "shared_card": rl_step.shared_card(rows)})
    assert md == ""  # no GRPO rows: no table, no line


def test_side_by_side_runs_average_only_the_steps_that_overlap() -> None:
    # b1 steps from t=100: [100,110] [110,120] [120,130] [130,140]; b2 from t=115: [115,127] [127,139] [139,151]
    got = rl_step.overlapping_steps({"b1": (100.0, [10, 10, 10, 10]), "b2": (115.0, [12, 12, 12])})
    assert got == {"b1": [2, 3], "b2": [0, 1]}  # the window is [115, 140]: b1's last two steps, b2's first two
    assert rl_step.overlapping_steps({"b1": (0.0, [5.0]), "b2": (10.0, [5.0])}) == {"b1": [], "b2": []}
    assert rl_step.overlapping_steps({"b1": (0.0, []), "b2": (0.0, [1.0])}) == {"b1": [], "b2": []}


def test_a_traced_step_is_left_out_of_the_means_and_its_split_reported(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(rl_step, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr("bench.common.RESULTS_DIR", tmp_path / "results")
    root = tmp_path / "t"
    steps = [_step(20, 9, 0, 0, 6), _step(7, 3, 0, 0, 3), _step(30, 3, 0, 0, 26), _step(5, 2, 0, 0, 2)]
    _grpo_run(root, "b1_uniproc", steps, 1, 55)
    cmd = root / "rl" / "b1_uniproc" / "command.sh"
    cmd.write_text(cmd.read_text().strip() + " global_profiler.tool=torch global_profiler.steps=[3]\n")
    split = {"span_s": 26.0, "gpu_busy_s": 4.0, "trace": "w.json.gz", "cpu_ops": [], "gpu_kernels": [],
             "regions": {"mini_batch": {"count": 8, "wall_s": 20.0, "gpu_busy_s": 4.0, "gpu_share": 0.2}}}
    (root / "rl" / "b1_uniproc" / "trace_split.json").write_text(json.dumps(split))
    (root / "jobs").mkdir()
    (root / "jobs" / "stages.tsv").write_text(f"b1_uniproc\t{T0}\t{T0 + 300}\t300\n")
    (root / "jobs" / "b1_uniproc.rc").write_text("0\n")
    (root / "card.txt").write_text("0, NVIDIA H200, 143771 MiB, 580.159.04\n")
    p = rl_step.run([root])
    run = p["runs"]["b1_uniproc"]
    assert run["steps_traced"] == [3] and run["steps"] == 3 and run["step_s"] == pytest.approx(6.0)
    assert run["trace"]["regions"]["mini_batch"]["gpu_share"] == 0.2
    md = (tmp_path / "results" / "rl_step.md").read_text()
    assert "## A traced step's worker stages" in md and "| mini_batch | 8 | 20.000 | 4.000 | 0.20 |" in md

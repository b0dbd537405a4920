"""bench/gpu/ab.sh and the shims it still uses, without a GPU: they parse, and `collect` packs what a run
left. (The node's own scripts are scripts/gpu_node/: tests/scripts/test_gpu_node_job.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "bench" / "gpu").glob("*.sh"))
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_parses(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0


def _phase(d: Path) -> None:
    (d / "checkpoints").mkdir(parents=True)
    (d / "tensorboard").mkdir()
    (d / "tensorboard" / "events.out").write_text("e")
    (d / "phase_result.json").write_text(json.dumps({"status": "ok"}))
    (d / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    (d / "checkpoints" / "early_stopping.json").write_text("{}")
    (d / "train.log").write_text("x" * 400_000)


def _collect(script: str, var: str, work: Path, out: Path) -> set[str]:
    # PYTHONPATH, MODEL_DIR and GOLDEN_DIR set (what node_setup.sh exports): it is not sourced here;
    # python3 is this interpreter (collect_lib.sh's node info goes through job.sh node-info)
    node = {"PYTHONPATH": str(REPO), "MODEL_DIR": str(work), "GOLDEN_DIR": str(work), "PATH": PATH}
    env = {**os.environ, **node, var: str(work), "OUT": str(out)}
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu" / script), "collect"], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    archive = next(out.glob("*.tar.gz"))
    with tarfile.open(archive) as tf:
        names = {n.removeprefix("./") for n in tf.getnames()}
        log = tf.extractfile("./b1/train.log")
        assert log is not None and len(log.read()) == 300_000  # the log's tail only
        versions = json.loads(tf.extractfile("./versions.json").read())  # type: ignore[union-attr]
    assert set(versions) >= {"python", "torch", "vllm", "verl", "ray"}
    return names


def test_the_shims_lead_to_the_node_scripts(tmp_path: Path) -> None:
    """bench/gpu/ keeps only what ab.sh uses until it goes; each shim names where the thing lives now."""
    assert {p.name for p in (REPO / "bench" / "gpu").iterdir() if p.name != "__pycache__"} == {
        "__init__.py", "ab.sh", "collect_lib.sh", "node_setup.sh", "serve.py"
    }
    assert "scripts/gpu_node/node_setup.sh" in (REPO / "bench" / "gpu" / "node_setup.sh").read_text()
    assert "trainer.serving.cli" in (REPO / "bench" / "gpu" / "serve.py").read_text()
    env = {**os.environ, "STX_VLLM_RUN_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.serve", "stop", "--ports", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # ab.sh's `python3 -m bench.gpu.serve ...` still runs


def test_ab_collect(tmp_path: Path) -> None:
    ab = tmp_path / "ab"
    _phase(ab / "b1")
    (ab / "phase_d").mkdir()
    (ab / "phase_d" / "metrics.json").write_text("{}")
    (ab / "stages.tsv").write_text("sft\t1\t2\t1\n")
    (ab / "preflight").mkdir()
    (ab / "preflight" / "c1_t1.3.json").write_text(json.dumps(PREFLIGHT))
    names = _collect("ab.sh", "AB", ab, tmp_path)
    want = {"b1/phase_result.json", "b1/metrics.jsonl", "b1/early_stopping.json", "b1/tensorboard.tar.gz"}
    assert want | {"phase_d/metrics.json", "stages.tsv", "card.txt", "preflight/c1_t1.3.json"} <= names


PREFLIGHT = {"reward": "pipeline", "prompts": 64, "n": 8, "temperature": 1.3, "informative_groups": 20,
             "informative_share": 0.3125, "mean_reward": 0.91234, "mean_group_std": 0.04321,
             "min_informative": 0.0, "ok": True, "improvable_share": 0.2, "best_minus_greedy": 0.0812,
             "invalid_share": 0.01, "per_source": {"e2e": {"improvable_share": 0.0},
                                                   "wikitabletext": {"improvable_share": 0.4}}}  # fmt: skip


def test_ab_wait_summarises_the_preflight_sweep(tmp_path: Path) -> None:
    """`wait preflight` prints one line per temperature and phase: what rl's temperature is chosen from."""
    ab = tmp_path / "ab"
    (ab / "preflight").mkdir(parents=True)
    (ab / "preflight" / "c1_t1.3.json").write_text(json.dumps(PREFLIGHT))
    (ab / "preflight.rc").write_text("0\n")
    (ab / "preflight.log").write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MODEL_DIR": str(ab), "GOLDEN_DIR": str(ab), "AB": str(ab)}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "ab.sh"), "wait", "preflight", "1"],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "preflight exit 0" in proc.stdout
    assert (
        "c1_t1.3.json informative 0.3125 improvable 0.2 best-greedy 0.0812 invalid 0.01 mean 0.912 "
        "{'e2e': 0.0, 'wikitabletext': 0.4}"
    ) in proc.stdout


def test_ab_eval_serves_the_model_the_phase_result_names(tmp_path: Path) -> None:
    """When early stopping keeps step 0 there is no <phase>/hf: eval must serve the phase result's hf_dir
    (the run of issue 23 asked vLLM for $AB/b1/hf, which did not exist)."""
    ab = tmp_path / "ab"
    (ab / "b1").mkdir(parents=True)
    (ab / "b1" / "phase_result.json").write_text(json.dumps({"status": "ok", "best_step": 0, "hf_dir": "/m/a1/hf"}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MODEL_DIR": str(ab), "GOLDEN_DIR": str(ab), "AB": str(ab)}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "ab.sh"), "_hf", "b1"],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "/m/a1/hf", proc.stderr
    bad = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "ab.sh"), "x"],
                         env={**env, "EXP": "pi3"}, capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and "EXP must be pi1 or pi2" in bad.stderr

"""Resume on another node: a finished loop folder packed into small checked pieces, the first folder removed, the
pieces unpacked elsewhere, and the loop's own reuse checks skip every finished phase and Phase D there."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.trainer.runs.test_loop import SAMPLE, FaultyPhaseRunner
from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop
from trainer.runs.record import RECORD as MANIFEST
from trainer.runs.reuse import finished as phase_done
from trainer.serving.endpoint import Endpoint, ServingMode
from trainer.serving.executors import ExecutorPool
from trainer.transfer.artifacts import ARTIFACTS, ArtifactError, pack, unpack

PHASES = ("a1", "a2", "b1", "b2")
PIECE = 4096


class TrainingRunnerForTests:
    """Writes what a finished phase leaves (run_phase's layout): an export, checkpoints with optimizer state,
    the early-stopping record, metrics, a log and the result; ``fail`` phases stop after their first checkpoint."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.fail = fail

    def __call__(self, run: PhaseRun) -> PhaseResult:
        out, name = run.out_dir, run.phase.name
        ckpt = out / "checkpoints" / "global_step_2"
        (ckpt / "actor").mkdir(parents=True)
        (ckpt / "actor" / "optim.pt").write_bytes(b"optimizer state" * 500)
        (out / "train.log").write_text("training\n")
        if name in self.fail:
            res = PhaseResult(name, run.profile, "failed", 1, run.command(), run.model_path, str(run.data_dir),
                              str(out), "t", 1.0, error="the allocation ended")  # fmt: skip
            res.write(out)
            return res
        hf = out / "hf"
        hf.mkdir()
        (hf / "model.safetensors").write_bytes(hashlib.sha256(name.encode()).digest() * 300)
        # the export's own record of where it came from: a model travels byte for byte
        (hf / "config.json").write_text(json.dumps({"_name_or_path": str(ckpt)}))
        (out / "checkpoints" / "early_stopping.json").write_text(json.dumps({"best_step": 2, "dir": str(ckpt)}))
        (out / "metrics.jsonl").write_text('{"step": 2, "val/score": 0.5}\n')
        res = PhaseResult(name, run.profile, "ok", 0, run.command(), run.model_path, str(run.data_dir), str(out),
                          "t", 1.0, best_step=2, checkpoint=str(ckpt), hf_dir=str(hf))  # fmt: skip
        res.write(out)
        return res


@contextlib.contextmanager
def phase_d_without_executors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Phase D without executors (none on this machine's budget): π1 'writes' the gold schemas, π2 no table
    (scored for real)."""

    def ensure(_pool: ExecutorPool, specs: Any) -> list[Endpoint]:
        mode = ServingMode("CPU", eager=True, prefix_caching=False)
        return [Endpoint("http://127.0.0.1:9", "policy", mode=mode) for _ in specs]

    def stage1_schemas(_label: str, _pi1: str, examples: Any, *_a: Any, **_kw: Any) -> list[str]:
        return [json.dumps(ex.schema_dict()) for ex in examples]

    def run_two_stage(
        _n: str, _p1: str, _p2: str, examples: Any, *_a: Any, schemas: list[str], **_kw: Any
    ) -> list[dict[str, Any]]:
        return [{"id": ex.id, "schema_prediction": s, "table_prediction": None}
                for ex, s in zip(examples, schemas, strict=True)]  # fmt: skip

    monkeypatch.setattr(ExecutorPool, "ensure", ensure)
    monkeypatch.setattr("trainer.evaluation.two_stage.stage1_schemas", stage1_schemas)
    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", run_two_stage)
    yield


def settings(out: Path) -> dict[str, tuple[str, str]]:
    return {
        "sft": (str(out / "a1" / "hf"), str(out / "a2" / "hf")),
        "local": (str(out / "b1" / "hf"), str(out / "b2" / "hf")),
    }


def config(out: Path) -> LoopConfig:
    return LoopConfig(golden=SAMPLE, out=out, profile="cpu-smoke", base_model="/base", reward_url="http://127.0.0.1:9",
                      rl_extra=("x=1",), until="local")  # fmt: skip


@pytest.fixture
def finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A loop folder after A1, A2, B1, B2 (through the loop and its phase step), Phase D of sft vs local, a C1
    cut by the end of its allocation, and loop 2's link to loop 1's C1 data."""
    out = tmp_path / "node1" / "loop"
    cfg = config(out)
    loop = Loop(cfg, runner=TrainingRunnerForTests(fail=("c1",)))
    assert loop.run()["stopped_after"] == "local"
    with monkeypatch.context() as mp, phase_d_without_executors(mp):
        Loop(cfg).evaluate(settings(out), "loop1", ("sft", "local"))
    with pytest.raises(RuntimeError, match="phase c1 failed"):
        loop.phase("c1", str(out / "b1" / "hf"), "http://127.0.0.1:9", out / "c1")
    loop.link_c1_data(out / "loop2" / "data")
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / "reward_api_local.log").write_text("served\n")
    return out


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}  # fmt: skip


def moved(old: Path, tmp: Path) -> tuple[Path, dict[str, str]]:
    """``old`` packed and removed: the new node sees only the pieces, brought back flat (not in their batch
    folders); the old folder's files that travelled, by hash."""
    rec = pack(old, tmp / "packed", piece_bytes=PIECE, batch_pieces=3)
    before = {f: h for f, h in digests(old).items() if f in {r["path"] for r in rec["files"]}}
    shutil.rmtree(old)
    incoming = tmp / "incoming"
    incoming.mkdir()
    for p in (tmp / "packed").rglob("*"):
        if p.is_file():
            shutil.copy(p, incoming / p.name)
    return incoming, before


def test_pack_takes_finished_work_in_pieces_and_leaves_checkpoints_and_logs(finished: Path, tmp_path: Path) -> None:
    rec = pack(finished, tmp_path / "packed", piece_bytes=PIECE, batch_pieces=3)
    files = {f["path"] for f in rec["files"]}
    for phase in PHASES:
        assert {
            f"{phase}/hf/model.safetensors",
            f"{phase}/hf/config.json",
            f"{phase}/phase_result.json",
            f"{phase}/phase_inputs.json",
            f"{phase}/metrics.jsonl",
            f"{phase}/checkpoints/early_stopping.json",
        } <= files
    assert {
        MANIFEST,
        "eval_loop1/metrics.json",
        "eval_loop1/eval_key.json",
        "eval_loop1/predictions_sft.jsonl",
        "eval_loop1/report.md",
        "stage1_cache/local.json",
        "data/b1/train.parquet",
        "data/c1/train.parquet",
    } <= files
    assert not [f for f in files if "global_step" in f or f.endswith(".log") or f.startswith(("logs/", "c1/"))]
    assert rec["links"] == {"loop2/data/c1": "../../data/c1"}
    assert sorted(rec["models"]) == [f"{p}/hf" for p in PHASES]
    assert rec["source"]["workdir"] == str(finished) and rec["format"] == 1
    # several pieces of at most PIECE bytes, at most 3 to a batch folder, each as recorded
    assert len(rec["pieces"]) > 6
    for piece in rec["pieces"]:
        path = tmp_path / "packed" / piece["batch"] / piece["name"]
        assert path.stat().st_size == piece["size"] <= PIECE
        assert hashlib.sha256(path.read_bytes()).hexdigest() == piece["sha256"]
    batches = [p for p in (tmp_path / "packed").iterdir() if p.is_dir()]
    assert len(batches) == -(-len(rec["pieces"]) // 3) and all(len(list(b.iterdir())) <= 3 for b in batches)
    assert json.loads((tmp_path / "packed" / ARTIFACTS).read_text()) == rec
    with pytest.raises(ArtifactError, match="must be new or empty"):
        pack(finished, tmp_path / "packed")
    with pytest.raises(ArtifactError, match="the pieces' folder is inside the loop folder"):
        pack(finished, finished / "pieces")


def test_unpacked_folder_is_the_same_and_the_loop_reuses_every_finished_phase(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = finished
    incoming, before = moved(old, tmp_path)
    new = tmp_path / "node2" / "loop"
    entry = unpack(incoming, new)
    after = digests(new)
    assert set(after) == set(before)
    rewritten = set(entry["rewritten"])
    assert {MANIFEST} | {
        f"{p}/{f}" for p in PHASES for f in ("phase_result.json", "checkpoints/early_stopping.json")
    } == rewritten
    assert all(after[f] == before[f] for f in before if f not in rewritten)  # models, data, keys: byte for byte
    assert not [f for f in rewritten if "/hf/" in f]
    for f in rewritten:
        data = json.loads((new / f).read_text())
        data.pop("unpacked", None)  # the manifest's record of where it came from
        assert str(old) not in json.dumps(data) and str(new) in json.dumps(data), f
    a1 = json.loads((new / "b1" / "phase_result.json").read_text())
    assert a1["hf_dir"] == str(new / "b1" / "hf") and a1["model_in"] == str(new / "a1" / "hf")
    assert a1["checkpoint"] == str(new / "b1" / "checkpoints" / "global_step_2") and a1["data_dir"] == str(new / "data")
    assert (new / "loop2" / "data" / "c1").resolve() == (new / "data" / "c1").resolve()
    assert json.loads((new / MANIFEST).read_text())["unpacked"][-1]["from"] == str(old)

    # the loop's own checks on the new node: every finished phase reused, nothing launched
    assert all(phase_done(new / p) is not None for p in PHASES) and phase_done(new / "c1") is None
    runner = FaultyPhaseRunner()
    cfg = dataclasses.replace(config(old), out=new)
    manifest = Loop(cfg, runner=runner).run()
    assert runner.launched == [] and manifest["stopped_after"] == "local"
    assert {manifest["phases"][p]["hf_dir"] for p in PHASES} == {str(new / p / "hf") for p in PHASES}
    assert Loop(cfg, runner=runner).phase("b2", str(new / "a2" / "hf"), "http://127.0.0.1:9", new / "b2") == str(
        new / "b2" / "hf"
    )

    def not_again(*_a: object, **_k: object) -> Any:
        raise AssertionError("Phase D ran again")

    monkeypatch.setattr("trainer.runs.phase_d_part.score", not_again)
    decision = Loop(cfg).evaluate(settings(new), "loop1", ("sft", "local"))
    assert decision == json.loads((new / "eval_loop1" / "metrics.json").read_text())["loop2"]
    assert runner.launched == []


def test_a_corrupt_or_missing_piece_is_named_and_nothing_is_written(finished: Path, tmp_path: Path) -> None:
    pack(finished, tmp_path / "packed", piece_bytes=PIECE, batch_pieces=3)
    piece = tmp_path / "packed" / "batch-000" / "piece-00001"
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    corrupt = r"piece piece-00001 \(.*\): sha256 \w+ is not the recorded \w+ \(corrupt, or a piece of another pack\)"
    with pytest.raises(ArtifactError, match=corrupt):
        unpack(tmp_path / "packed", tmp_path / "new")
    assert not (tmp_path / "new").exists()
    piece.unlink()
    with pytest.raises(ArtifactError, match=r"piece piece-00001 \(batch-000/piece-00001\) is missing under"):
        unpack(tmp_path / "packed", tmp_path / "new")
    piece.write_bytes(b"cut" * 10)
    with pytest.raises(ArtifactError, match=r"piece piece-00001 \(.*\): 30 bytes, artifacts.json records \d+"):
        unpack(tmp_path / "packed", tmp_path / "new")


def test_unpack_refuses_a_folder_that_holds_something(finished: Path, tmp_path: Path) -> None:
    pack(finished, tmp_path / "packed", piece_bytes=PIECE)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"new: the new loop folder must be new or empty"):
        unpack(tmp_path / "packed", tmp_path / "new")
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["notes.txt"]


def test_artifacts_json_of_another_format_or_leaving_the_folder_is_refused(finished: Path, tmp_path: Path) -> None:
    pack(finished, tmp_path / "packed", piece_bytes=PIECE)
    path = tmp_path / "packed" / ARTIFACTS
    rec = json.loads(path.read_text())
    path.write_text(json.dumps(rec | {"format": 99}))
    with pytest.raises(ArtifactError, match="format must be 1, got 99"):
        unpack(tmp_path / "packed", tmp_path / "new")
    rec["files"][0]["path"] = "../outside"
    path.write_text(json.dumps(rec))
    with pytest.raises(ArtifactError, match=r"path '../outside' would leave the loop folder"):
        unpack(tmp_path / "packed", tmp_path / "new")


def test_pack_and_unpack_commands(finished: Path, tmp_path: Path) -> None:
    from trainer.cli import app

    cli = CliRunner()
    res = cli.invoke(app, ["loop", "pack", "--workdir", str(finished), "--out", str(tmp_path / "p"),
                           "--piece-mib", "0.01", "--batch-pieces", "2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "pieces" in res.output and (tmp_path / "p" / "batch-001").is_dir()
    res = cli.invoke(app, ["loop", "unpack", "--pieces", str(tmp_path / "p"), "--workdir", str(tmp_path / "new")])
    assert res.exit_code == 0, res.output
    assert phase_done(tmp_path / "new" / "b2") is not None
    res = cli.invoke(app, ["loop", "unpack", "--pieces", str(tmp_path / "p"), "--workdir", str(tmp_path / "new")])
    assert res.exit_code == 1 and "must be new or empty" in res.output
    assert cli.invoke(app, ["loop", "--help"]).exit_code == 0

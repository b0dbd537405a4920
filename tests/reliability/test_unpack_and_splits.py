"""Unpack and splits: ``trainer loop unpack`` given pieces or an ``artifacts.json`` it cannot trust, and golden data
whose splits share documents or hold none (``trainer data build``, ``trainer loop``, ``python -m shared validate``).

Expected: every untrusted pack is refused in one line naming the piece or path, before anything is written outside
the new loop folder (the tampered or foreign pieces before anything is written at all); no validation or test
document is trained on; an empty split stops the build and the loop before any phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shared.golden import EmptySplitError
from shared.split_overlap import SplitOverlapError, read_overlaps
from tests.helpers.tampered_packs import FILES, OTHER_RUN_FILES, flip_byte, forged_pack, record_over_other_pieces
from tests.shared.test_split_overlap import DROPPED, overlapping_golden
from tests.trainer.runs.test_loop import FaultyPhaseRunner
from trainer.data.datasets import build_datasets, read_rows
from trainer.runs.config import LoopConfig
from trainer.runs.loop import Loop
from trainer.transfer.artifacts import ARTIFACTS


def unpack_cli(pieces: Path, workdir: Path) -> tuple[int, list[str]]:
    from trainer.cli import app

    res = CliRunner().invoke(app, ["loop", "unpack", "--pieces", str(pieces), "--workdir", str(workdir)])
    return res.exit_code, res.output.strip().splitlines()


def beside(tmp_path: Path) -> list[str]:
    """What a refused unpack left under ``tmp_path`` besides the pieces' folders."""
    return sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("pieces"))


def test_unpack_tampered_piece(tmp_path: Path, record_property: Any) -> None:
    """`loop unpack` with one byte of one piece flipped (its size kept)."""
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    flip_byte(pieces / "batch-000" / "piece-00001", 10)
    code, lines = unpack_cli(pieces, tmp_path / "new")
    record_property("expected", "exit 1, one line naming the piece and its sha256; nothing written")
    said = lines[0].replace(str(pieces), "PIECES")
    record_property("observed", f"exit {code}: {said[:150]}...; written: {beside(tmp_path)}")
    assert code == 1 and len(lines) == 1 and "piece piece-00001" in lines[0] and "is not the recorded" in lines[0]
    assert beside(tmp_path) == []


def test_unpack_missing_piece(tmp_path: Path, record_property: Any) -> None:
    """`loop unpack` with one piece of the pack left out."""
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    (pieces / "batch-000" / "piece-00002").unlink()
    code, lines = unpack_cli(pieces, tmp_path / "new")
    record_property("expected", "exit 1, one line naming the missing piece; nothing written")
    said = lines[0].split(" is missing")[0]
    record_property("observed", f"exit {code}: {said} is missing; written: {beside(tmp_path)}")
    assert code == 1 and len(lines) == 1 and "piece piece-00002 (batch-000/piece-00002) is missing" in lines[0]
    assert beside(tmp_path) == []


def test_unpack_pieces_of_another_run(tmp_path: Path, record_property: Any) -> None:
    """`loop unpack` of one run's artifacts.json over another run's pieces (same piece names)."""
    ours = forged_pack(tmp_path / "pieces_ours", FILES, {})
    theirs = forged_pack(tmp_path / "pieces_theirs", OTHER_RUN_FILES, {})
    mixed = record_over_other_pieces(ours, theirs, tmp_path / "pieces_mixed")
    code, lines = unpack_cli(mixed, tmp_path / "new")
    record_property("expected", "exit 1, one line naming the first foreign piece; nothing written")
    record_property("observed", f"exit {code}: piece {lines[0].split()[2]} ... {lines[0].rsplit('(', 1)[-1]}")
    assert code == 1 and len(lines) == 1 and "piece piece-00000" in lines[0] and "another pack" in lines[0]
    assert beside(tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "files", "links", "named"),
    [
        ("an absolute file path", {"/tmp/loop_victim.json": b"{}"}, {}, "path '/tmp/loop_victim.json' would leave"),
        ("a file path with ..", {"data/../../victim.json": b"{}"}, {}, "path 'data/../../victim.json' would leave"),
        ("a link target with ..", {}, {"data/up": "../../.."}, "link 'data/up': its target '../../..' would leave"),
        (
            "links that each point inside but escape together "
            "(run.tmp → p/victim.json, p → q/.., q → d/../.., d → a1/hf)",
            {},
            {"d": "a1/hf", "run.tmp": "p/victim.json", "p": "q/..", "q": "d/../.."},
            "link 'run.tmp': its target 'p/victim.json' passes through the link p",
        ),
        ("a file under a recorded link", {"lnk/x.json": b"{}"}, {"lnk": "data"}, "through the link lnk"),
    ],
)
def test_unpack_paths_that_leave_the_folder(
    tmp_path: Path, record_property: Any, kind: str, files: dict[str, bytes], links: dict[str, str], named: str
) -> None:
    """`loop unpack` of a well-formed pack whose artifacts.json holds a path that leaves the new folder."""
    pieces = forged_pack(tmp_path / "pieces", {**FILES, **files}, links)
    code, lines = unpack_cli(pieces, tmp_path / "new")
    record_property("tried", f"`loop unpack` of a pack (pieces intact) whose artifacts.json holds {kind}")
    record_property("expected", "exit 1, one line naming the path; nothing written inside or outside the folder")
    said = lines[0].split(ARTIFACTS + ":", 1)[-1]
    record_property("observed", f"exit {code}: ...{said}; written: {beside(tmp_path)}")
    assert code == 1 and len(lines) == 1 and named in lines[0]
    assert beside(tmp_path) == []


def test_split_overlap_in_data_build_and_loop(tmp_path: Path, record_property: Any) -> None:
    """Golden data whose train split holds a test id and two held-out texts under new ids (case, whitespace changed):
    data build by default, data build --strict-splits, and trainer loop --strict-splits."""
    record_property(
        "tried",
        "Train rows that repeat held-out documents (a test id; a test and a validation text under new ids, case "
        "and whitespace changed): data build, data build --strict-splits, trainer loop --strict-splits",
    )
    golden = overlapping_golden(tmp_path / "golden")
    counts = build_datasets(golden, tmp_path / "data", ["a1", "b1", "c1"])
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())["split_overlap"]
    trained = {r["extra_info"]["id"] for r in read_rows(tmp_path / "data" / "c1" / "train.parquet")}
    with pytest.raises(SplitOverlapError) as strict:
        build_datasets(golden, tmp_path / "strict", ["b1"], strict_splits=True)
    runner = FaultyPhaseRunner()
    cfg = LoopConfig(golden=golden, out=tmp_path / "loop", profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b",
                     reward_url="http://127.0.0.1:9", strict_splits=True)  # fmt: skip
    with pytest.raises(SplitOverlapError):
        Loop(cfg, runner=runner).run()
    record_property(
        "expected",
        "default: the 3 train rows dropped, counted and named in the manifest, held-out splits unchanged; strict: "
        "one-line refusal naming the ids; loop: stops before any phase",
    )
    record_property(
        "observed",
        f"train rows {manifest['sizes']['train']} -> {counts['c1']['train']}, manifest dropped_train "
        f"{manifest['dropped_train']}; strict: {str(strict.value)[:60]}... (names all 3: "
        f"{all(i in str(strict.value) for i in DROPPED)}); loop phases launched: {len(runner.launched)}",
    )
    assert manifest["dropped_train"] == {"count": 3, "ids": DROPPED} and not trained & set(DROPPED)
    assert counts["c1"] == {"train": 11, "validation": 6} and "\n" not in str(strict.value)
    assert all(i in str(strict.value) for i in DROPPED) and runner.launched == []


def test_empty_split_in_data_build_and_loop(tmp_path: Path, record_property: Any) -> None:
    """An empty common_test_schemas.jsonl given to data build and to trainer loop."""
    golden = overlapping_golden(tmp_path / "golden", empty="test")
    with pytest.raises(EmptySplitError) as build:
        build_datasets(golden, tmp_path / "data", ["b1"])
    runner = FaultyPhaseRunner()
    cfg = LoopConfig(golden=golden, out=tmp_path / "loop", profile="cpu-smoke", pi1_sft="/a", pi2_sft="/b",
                     reward_url="http://127.0.0.1:9")  # fmt: skip
    with pytest.raises(EmptySplitError) as loop:
        Loop(cfg, runner=runner).run()
    record_property("expected", "both stop naming the file; no data written, no phase launched")
    record_property(
        "observed",
        f"build: {Path(str(build.value)).name}; loop: {Path(str(loop.value)).name}; data written: "
        f"{(tmp_path / 'data').exists()}; phases launched: {len(runner.launched)}",
    )
    assert "the test split is empty" in str(build.value) and "the test split is empty" in str(loop.value)
    assert not (tmp_path / "data").exists() and runner.launched == []


def test_split_overlap_in_the_projects_golden_data(golden_dir: Path, record_property: Any) -> None:
    """The project's golden data (../shared/data/golden): documents shared between splits."""
    found = read_overlaps(golden_dir)
    rep = found.repeats["train"]
    record_property("expected", "24 validation and 10 test documents repeat a train document; those 34 train rows "
                    "are dropped; repeats within train counted, kept")  # fmt: skip
    record_property("observed", f"{found.counts()}; train rows dropped {len(found.train_drop)}; train texts repeated "
                    f"{rep.texts} ({rep.extra_rows} extra rows)")  # fmt: skip
    assert found.counts() == {"train~validation": 24, "train~test": 10, "validation~test": 0}
    assert len(found.train_drop) == 34 and (rep.texts, rep.extra_rows) == (122, 123)

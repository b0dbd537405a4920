"""``loop unpack`` refuses pieces and records it cannot trust before it writes outside the new loop folder
(trainer/transfer/artifacts.py): a tampered, missing or foreign piece, and an ``artifacts.json`` whose paths are
absolute, hold ``..``, or reach a recorded link on their way. Each refusal is one line naming the piece or path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.helpers.tampered_packs import (
    FILES,
    OTHER_RUN_FILES,
    edit_record,
    flip_byte,
    forged_pack,
    record_over_other_pieces,
)
from trainer.transfer.artifacts import ARTIFACTS, ArtifactError, pack, unpack


def outside_untouched(tmp_path: Path, new: Path) -> list[str]:
    """What exists under ``tmp_path`` besides the pieces and ``new``: must be nothing a refused unpack wrote."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("pieces", "other", new.name))


def test_a_forged_pack_of_safe_paths_unpacks(tmp_path: Path) -> None:
    """The forging helper writes what unpack reads: the refusals below are the paths', not the format's."""
    pieces = forged_pack(tmp_path / "pieces", FILES, {"loop2/data/b1": "../../data/b1"})
    unpack(pieces, tmp_path / "new")
    assert (tmp_path / "new" / "a1" / "hf" / "model.safetensors").read_bytes() == FILES["a1/hf/model.safetensors"]
    assert (tmp_path / "new" / "loop2" / "data" / "b1" / "train.parquet").read_bytes() == b"p" * 900


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("file", "/etc/loop_victim.json", r"path '/etc/loop_victim.json' would leave the loop folder"),
        ("file", "data/../../victim.json", r"path 'data/../../victim.json' would leave the loop folder"),
        ("link", "/tmp/victim_link", r"path '/tmp/victim_link' would leave the loop folder"),
        ("link", "data/../../victim_link", r"path 'data/../../victim_link' would leave the loop folder"),
        ("target", "/etc", r"link 'escape': its target '/etc' would leave the loop folder"),
        ("target", "../..", r"link 'escape': its target '../..' would leave the loop folder"),
        ("target", "data/../../../x", r"link 'escape': its target 'data/../../../x' would leave the loop folder"),
    ],
)
def test_absolute_or_dotdot_paths_are_refused_before_anything_is_written(
    tmp_path: Path, where: str, value: str, message: str
) -> None:
    files, links = dict(FILES), {}
    if where == "file":
        files[value] = b"{}"
    elif where == "link":
        links[value] = "data"
    else:
        links["escape"] = value
    pieces = forged_pack(tmp_path / "pieces", files, links)
    new = tmp_path / "new"
    with pytest.raises(ArtifactError, match=message) as err:
        unpack(pieces, new)
    assert "\n" not in str(err.value) and str(pieces / ARTIFACTS) in str(err.value)
    assert not new.exists() and outside_untouched(tmp_path, new) == []


def test_a_link_chain_that_escapes_only_once_every_link_exists_is_refused(tmp_path: Path) -> None:
    """Each link alone resolves inside the folder when it is made, but together they lead out: ``p`` → ``q/..`` is
    made before ``q`` exists, ``q`` → ``d/../..`` climbs back out of ``d`` (→ ``a1/hf``) to the folder itself, so
    ``p`` is the folder's parent; the run record's temporary file ``run.tmp`` → ``p/victim.json`` is then written
    there when the unpack records itself. Refused before anything is written: ``run.tmp``'s target passes through
    the link ``p``; without ``run.tmp``, ``p``'s passes through ``q``. (Before these checks, this pack unpacked and
    wrote ``victim.json`` beside the new folder.)"""
    links = {"d": "a1/hf", "run.tmp": "p/victim.json", "p": "q/..", "q": "d/../.."}
    pieces = forged_pack(tmp_path / "pieces", FILES, links)
    new = tmp_path / "new"
    with pytest.raises(ArtifactError, match=r"link 'run.tmp': its target 'p/victim.json' passes through the link p"):
        unpack(pieces, new)
    assert not new.exists() and not (tmp_path / "victim.json").exists()
    links.pop("run.tmp")
    pieces = forged_pack(tmp_path / "pieces2", FILES, links)
    with pytest.raises(ArtifactError, match=r"link 'p': its target 'q/..' passes through the link q"):
        unpack(pieces, new)
    assert not new.exists()


@pytest.mark.parametrize(
    ("files", "links", "message"),
    [
        ({"lnk/x.json": b"{}"}, {"lnk": "data"}, r"file 'lnk/x.json' would be written through the link lnk"),
        ({}, {"lnk": "data", "lnk/inner": "b1"}, r"link 'lnk/inner' would be written through the link lnk"),
        ({"data/b1/train.parquet": b"p" * 900}, {"data/b1/train.parquet": "x"}, r"recorded as a file and as a link"),
        ({"data": b"x"}, {}, r"file 'data' is also the folder of another recorded path"),
    ],
)
def test_a_path_through_a_recorded_link_is_refused(
    tmp_path: Path, files: dict[str, bytes], links: dict[str, str], message: str
) -> None:
    base = dict(FILES)
    base.update(files)
    pieces = forged_pack(tmp_path / "pieces", base, links)
    with pytest.raises(ArtifactError, match=message):
        unpack(pieces, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_tampered_piece_is_refused_naming_it_even_with_its_size_kept(tmp_path: Path) -> None:
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    flip_byte(pieces / "batch-000" / "piece-00002", 7)
    with pytest.raises(ArtifactError, match=r"piece piece-00002 \(.*piece-00002\): sha256 \w+ is not the recorded"):
        unpack(pieces, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_pieces_of_another_pack_are_refused(tmp_path: Path) -> None:
    """The same piece names from another run: found by name, refused by sha256, before anything is written; both
    runs' pieces under one folder: the name found twice is refused."""
    ours = forged_pack(tmp_path / "pieces", FILES, {})
    theirs = forged_pack(tmp_path / "other", OTHER_RUN_FILES, {})
    mixed = record_over_other_pieces(ours, theirs, tmp_path / "mixed")
    with pytest.raises(ArtifactError, match=r"piece piece-00000 \(.*\): sha256 \w+ .*\(corrupt, or a piece of another"):
        unpack(mixed, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    for p in ours.rglob("piece-*"):
        (mixed / "ours").mkdir(exist_ok=True)
        (mixed / "ours" / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ArtifactError, match=r"piece piece-00000 is there 2 times"):
        unpack(mixed, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_missing_piece_is_named(tmp_path: Path) -> None:
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    (pieces / "batch-000" / "piece-00003").unlink()
    with pytest.raises(ArtifactError, match=r"piece piece-00003 \(batch-000/piece-00003\) is missing under"):
        unpack(pieces, tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["files"][0].pop("sha256"), r"files\[0\]\['sha256'\]: Field required"),
        (lambda r: r["files"][1].update(size=-1), r"files\[1\]\['size'\]: Input should be greater than or equal"),
        (lambda r: r["pieces"][0].update(name="../piece-00000"), r"pieces\[0\]\['name'\]: String should match"),
        (lambda r: r["pieces"].append("piece-00009"), r"pieces\[\d+\]: Input should be a valid dictionary"),
        (lambda r: r["links"].update(x=3), r"links\['x'\]: Input should be a valid string"),
        (lambda r: r["files"].append(dict(r["files"][0])), r"file 'run.json' is recorded twice"),
    ],
)
def test_malformed_entries_are_named(tmp_path: Path, change: Any, message: str) -> None:
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    edit_record(pieces, change)
    with pytest.raises(ArtifactError, match=message):
        unpack(pieces, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_file_whose_recorded_hash_is_not_its_content_is_not_left_behind(tmp_path: Path) -> None:
    """The pieces are intact but ``artifacts.json`` records another sha256 for one file (pieces re-hashed after a
    forged record): the file is named, and not left in the new folder."""
    pieces = forged_pack(tmp_path / "pieces", FILES, {})
    edit_record(pieces, lambda r: r["files"][1].update(sha256="0" * 64))
    with pytest.raises(ArtifactError, match=r"file a1/hf/model.safetensors: 3000 bytes, sha256 \w+; artifacts.json"):
        unpack(pieces, tmp_path / "new")
    assert not (tmp_path / "new" / "a1" / "hf" / "model.safetensors").exists()


def test_the_unpack_command_prints_one_line_naming_the_path(tmp_path: Path) -> None:
    from trainer.cli import app

    pieces = forged_pack(tmp_path / "pieces", {**FILES, "/etc/victim.json": b"{}"}, {})
    res = CliRunner().invoke(app, ["loop", "unpack", "--pieces", str(pieces), "--workdir", str(tmp_path / "new")])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        f"error: {pieces / ARTIFACTS}: path '/etc/victim.json' would leave the loop folder"
    ]


def test_pack_records_only_paths_unpack_accepts(tmp_path: Path) -> None:
    """A real loop folder's links (relative, with ``..``) pass the checks: pack and unpack agree."""
    loop = tmp_path / "loop"
    (loop / "data" / "c1").mkdir(parents=True)
    (loop / "data" / "c1" / "train.parquet").write_bytes(b"rows")
    (loop / "run.json").write_text(json.dumps({"config": {"out": str(loop)}}))
    (loop / "loop2" / "data").mkdir(parents=True)
    (loop / "loop2" / "data" / "c1").symlink_to((loop / "data" / "c1").resolve(), target_is_directory=True)
    pack(loop, tmp_path / "pieces")
    unpack(tmp_path / "pieces", tmp_path / "new")
    assert (tmp_path / "new" / "loop2" / "data" / "c1" / "train.parquet").read_bytes() == b"rows"

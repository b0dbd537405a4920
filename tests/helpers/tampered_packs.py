"""Packs someone could tamper with, for the refusal tests of ``trainer loop unpack`` (trainer/transfer/artifacts.py)
and of the air-gapped wheelhouse (scripts/gpu_node/wheelhouse_pack.py): a ``loop pack`` of any files and links, its
``artifacts.json`` edited, one byte of a piece or chunk changed with its size kept, and one run's record over
another run's pieces."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.transfer.artifacts import ARTIFACTS, FORMAT, PieceWriter

# A small loop folder: the run record, one export's weights, one phase's data.
FILES = {"run.json": b'{"config": {}}\n', "a1/hf/model.safetensors": b"w" * 3000, "data/b1/train.parquet": b"p" * 900}
# Another run's folder: the same paths (so the same piece names), other bytes.
OTHER_RUN_FILES = {**FILES, "run.json": b'{"config": {"out": "other"}}\n'}


def forged_pack(out: Path, files: dict[str, bytes], links: dict[str, str], piece_bytes: int = 1024) -> Path:
    """A pack written as :func:`~trainer.transfer.artifacts.pack` writes one (tar stream cut into pieces, every size
    and sha256 recorded) but of any files and links: what someone who controls the pieces and their
    ``artifacts.json`` can send."""
    out.mkdir(parents=True)
    writer = PieceWriter(out, piece_bytes, 4)
    with writer, tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    record = {
        "format": FORMAT, "created": "t", "commit": None, "source": {"workdir": "/old/loop", "recorded_as": []},
        "piece_bytes": piece_bytes, "batch_pieces": 4, "models": [],
        "files": [{"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()],
        "links": links, "pieces": writer.pieces,
    }  # fmt: skip
    (out / ARTIFACTS).write_text(json.dumps(record))
    return out


def edit_record(pieces: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``change`` to the pack's ``artifacts.json`` in place (the pieces untouched)."""
    path = pieces / ARTIFACTS
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def flip_byte(path: Path, at: int, mask: int = 0x01) -> None:
    """XOR byte ``at`` of ``path`` with ``mask``: a damaged piece or chunk whose size is still the recorded one."""
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


def record_over_other_pieces(ours: Path, theirs: Path, out: Path) -> Path:
    """``out`` holding ``ours``' ``artifacts.json`` beside ``theirs``' pieces (same names, other bytes, flat)."""
    out.mkdir()
    (out / ARTIFACTS).write_bytes((ours / ARTIFACTS).read_bytes())
    for p in theirs.rglob("piece-*"):
        (out / p.name).write_bytes(p.read_bytes())
    return out

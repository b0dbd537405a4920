"""Resume on another node: a loop folder's finished work packed into checked pieces, and unpacked into a new folder
that ``trainer loop`` goes on from (a preempted or time-limited allocation continues elsewhere).

What travels (:func:`pack`): the run record (``run.json``, ``report.md``); of every finished phase
(:func:`trainer.runs.reuse.finished`: its result says ok and its exported model is there) the exported model
(``hf/``), the files at the top of its folder but its logs (``phase_result.json``, ``phase_inputs.json``,
``metrics.jsonl``, ``preflight.json``) and the state records at the top of ``checkpoints/`` (early stopping, length
filters, the SFT epoch plan); every other file of the folder: the built data (``data/``, ``loop2/data/``,
``rft/*/data/``, with the C2 precompute's key), ``train_sets/``, Phase D's outputs (``eval_*/``: metrics, report,
per-document predictions and scores, key) and the kept Stage-1 schemas (``stage1_cache/``). Symbolic links inside
the folder travel as relative links.

What does not: the checkpoints (``checkpoints/*/``: weights and optimizer states), ``*.log`` and ``logs/``,
hidden and ``*.tmp`` files, the folders of phases that did not finish (they train again from their start), and
anything outside the folder: the golden files, ``--base-model``, ``--pi1-sft``/``--pi2-sft``. The new node needs
those with the same content (the reuse keys hold content fingerprints), at any path.

The pieces: one uncompressed tar stream (weights do not compress) cut into ``piece-NNNNN`` of at most
``piece_bytes``, in folders ``batch-NNN`` of at most ``batch_pieces`` pieces (one transfer takes one batch),
beside :data:`ARTIFACTS` (format version, every file with its size and sha256, the links, every piece with its
size and sha256, the source folder, the commit when known).

Unpacking checks before it writes: :data:`ARTIFACTS`'s entries have their fields (:class:`FileEntry`,
:class:`PieceEntry`), every recorded path stays inside the new folder (:func:`check_paths`: no absolute path, no
``..``, nothing recorded twice or under a recorded link, no link whose target leaves the folder or passes through a
recorded link), the folder must be new or empty, every piece must be found (by name, anywhere under the pieces
folder) with its recorded size and sha256; then every file is rebuilt and checked against its sha256 (one that
differs is removed). A failed check is an :class:`ArtifactError` naming the piece or file and why. Last, the source
folder's paths recorded in the JSON files outside the exported models (the manifest and ``phase_result.json``:
``hf_dir``, ``checkpoint``, ``out_dir``, ``data_dir``, ``model_in``, ``command``; the Phase-D settings, ...) are
rewritten to the new folder; the content keys hold no paths and the models are left byte for byte. The manifest
records the unpacking under ``unpacked``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.golden import sha256_file
from trainer.phases.launch import REPO_ROOT, RESULT_FILE
from trainer.runs.record import RECORD as MANIFEST
from trainer.runs.record import RunRecord, read_json
from trainer.runs.reuse import finished as phase_done

ARTIFACTS = "artifacts.json"
FORMAT = 1
DEFAULT_PIECE_BYTES = 15 * 2**20  # fits transfers of at most 16 MiB a file
DEFAULT_BATCH_PIECES = 4  # ... and at most 64 MiB in all
CHUNK = 2**20
SHA256 = r"^[0-9a-f]{64}$"

Progress = Callable[[int, int], None]  # (bytes just read or written, the total to read or write)


class ArtifactError(RuntimeError):
    """A loop folder that cannot be packed, or pieces that cannot be unpacked; the message names the file, piece
    or field, and why."""


# -- pack


@dataclass
class Selection:
    """What of a loop folder travels: files and links (relative POSIX paths), the exported model folders."""

    files: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # link → its target, relative to the link's folder
    models: list[str] = field(default_factory=list)


def skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith((".tmp", ".log"))


def select(workdir: Path) -> Selection:
    """What a resume needs of ``workdir`` (the module docstring says what travels)."""
    root = workdir.resolve()
    sel = Selection()
    for here, dirs, files in os.walk(root):
        folder = Path(here)
        rel = folder.relative_to(root)
        if rel == Path("logs"):
            dirs[:] = []
            continue
        if RESULT_FILE in files:
            dirs[:], files = [], []
            select_phase(root, folder, sel)
        for name in [*dirs, *files]:
            if (folder / name).is_symlink():
                select_link(root, folder / name, sel)
        dirs[:] = sorted(d for d in dirs if not skipped(d) and not (folder / d).is_symlink())
        sel.files += [(rel / f).as_posix() for f in sorted(files) if not skipped(f) and not (folder / f).is_symlink()]
    return sel


def select_phase(root: Path, folder: Path, sel: Selection) -> None:
    """A finished phase's export, top-level files and checkpoint records; nothing of an unfinished one."""
    res = phase_done(folder)
    if res is None:
        return
    assert res.hf_dir is not None
    hf = Path(res.hf_dir).resolve()
    if not hf.is_relative_to(folder):
        raise ArtifactError(f"{folder / RESULT_FILE}: hf_dir {res.hf_dir} is outside the phase's folder")
    sel.models.append(hf.relative_to(root).as_posix())
    tops = [p for p in folder.iterdir() if p.is_file() and not skipped(p.name)]
    ckpt = folder / "checkpoints"
    records = [p for p in ckpt.iterdir() if p.is_file() and not skipped(p.name)] if ckpt.is_dir() else []
    exported = [p for p in hf.rglob("*") if p.is_file() and not any(skipped(x) for x in p.relative_to(hf).parts)]
    sel.files += sorted(p.relative_to(root).as_posix() for p in (*tops, *records, *exported))


def select_link(root: Path, link: Path, sel: Selection) -> None:
    target = link.resolve()
    if not target.is_relative_to(root):
        raise ArtifactError(f"{link}: a link to {target}, outside the loop folder {root}; it would not travel")
    sel.links[link.relative_to(root).as_posix()] = os.path.relpath(target, link.parent.resolve())


class PieceWriter(io.RawIOBase):
    """A write-only stream cut into ``batch-NNN/piece-NNNNN`` files of at most ``piece_bytes``, each hashed."""

    def __init__(self, out_dir: Path, piece_bytes: int, batch_pieces: int) -> None:
        super().__init__()
        self.out_dir, self.piece_bytes, self.batch_pieces = out_dir, piece_bytes, batch_pieces
        self.pieces: list[dict[str, Any]] = []
        self.fh: io.BufferedWriter | None = None
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if self.fh is None or self.size == self.piece_bytes:
                self._next()
            assert self.fh is not None
            n = min(len(view) - done, self.piece_bytes - self.size)
            self.fh.write(view[done : done + n])
            self.hash.update(view[done : done + n])
            self.size += n
            done += n
        return done

    def _next(self) -> None:
        self._finish()
        index = len(self.pieces)
        batch = f"batch-{index // self.batch_pieces:03d}"
        name = f"piece-{index:05d}"
        (self.out_dir / batch).mkdir(parents=True, exist_ok=True)
        self.fh = (self.out_dir / batch / name).open("wb")
        self.pieces.append({"name": name, "batch": batch})
        self.hash, self.size = hashlib.sha256(), 0

    def _finish(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.pieces[-1] |= {"size": self.size, "sha256": self.hash.hexdigest()}
            self.fh = None

    def close(self) -> None:
        self._finish()
        super().close()


class HashingReader:
    """Reads a file for tar, hashing what passes and reporting its size to ``progress``."""

    def __init__(self, fh: io.BufferedReader, progress: Progress | None, total: int) -> None:
        self.fh, self.progress, self.total = fh, progress, total
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.hash.update(data)
        if self.progress is not None:
            self.progress(len(data), self.total)
        return data


def commit() -> str | None:
    """The repository's commit (``git rev-parse HEAD``), or None where there is no git."""
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def recorded_out(workdir: Path) -> list[str]:
    """The forms under which the loop recorded its folder: the absolute path, and ``config.out`` as given."""
    root = workdir.resolve()
    forms = {str(root), str(workdir.absolute())}
    config = (read_json(workdir / MANIFEST) or {}).get("config") or {}
    given = config.get("out")
    if isinstance(given, str) and given:
        if os.path.normpath(given) in (".", ""):
            raise ArtifactError(
                f"{workdir / MANIFEST}: config.out is {given!r}: paths under it cannot be told from others; "
                "run the loop with a named --out"
            )
        forms.add(os.path.normpath(given))
    return sorted(forms, key=len, reverse=True)


def pack(
    workdir: Path,
    out_dir: Path,
    piece_bytes: int = DEFAULT_PIECE_BYTES,
    batch_pieces: int = DEFAULT_BATCH_PIECES,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Pack what a resume needs of the loop folder ``workdir`` into pieces under ``out_dir`` (new or empty) with
    their :data:`ARTIFACTS`; returns what it records there. ``progress`` is called after every read."""
    if piece_bytes < 1 or batch_pieces < 1:
        raise ArtifactError(f"piece_bytes and batch_pieces must be ≥ 1, got {piece_bytes} and {batch_pieces}")
    if not (workdir / MANIFEST).is_file():
        raise ArtifactError(f"{workdir}: not a loop folder (no {MANIFEST})")
    root = workdir.resolve()
    if out_dir.resolve().is_relative_to(root):
        raise ArtifactError(
            f"{out_dir}: the pieces' folder is inside the loop folder {root}; a later pack would take it"
        )
    old = recorded_out(workdir)
    sel = select(workdir)
    refuse_non_empty(out_dir, "the pieces' folder")
    total = sum((root / name).stat().st_size for name in sel.files)
    writer = PieceWriter(out_dir, piece_bytes, batch_pieces)
    with writer, tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        files = [add_file(tar, root, name, progress, total) for name in sel.files]
    record = {
        "format": FORMAT,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "source": {"workdir": str(root), "recorded_as": old},
        "piece_bytes": piece_bytes,
        "batch_pieces": batch_pieces,
        "models": sel.models,
        "files": files,
        "links": sel.links,
        "pieces": writer.pieces,
    }
    (out_dir / ARTIFACTS).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return record


def add_file(tar: tarfile.TarFile, root: Path, name: str, progress: Progress | None, total: int) -> dict[str, Any]:
    """``name`` into the stream; its record (path, size, sha256)."""
    path = root / name
    with path.open("rb") as fh:
        info = tar.gettarinfo(arcname=name, fileobj=fh)  # a linked file travels as its content
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        reader = HashingReader(fh, progress, total)
        tar.addfile(info, reader)
    return {"path": name, "size": info.size, "sha256": reader.hash.hexdigest()}


def refuse_non_empty(folder: Path, what: str) -> None:
    """Create ``folder``; an existing file or non-empty folder there is an error."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ArtifactError(f"{folder}: {what} must be new or empty")
    folder.mkdir(parents=True, exist_ok=True)


# -- unpack


class FileEntry(BaseModel):
    """A file :data:`ARTIFACTS` records: its path in the loop folder, size and sha256."""

    model_config = ConfigDict(extra="allow")

    path: str = Field(min_length=1)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)


class PieceEntry(BaseModel):
    """A piece :data:`ARTIFACTS` records: its name, batch folder, size and sha256."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^piece-\d{5,}$")
    batch: str = Field(pattern=r"^batch-\d{3,}$")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)


ENTRIES: dict[str, TypeAdapter[Any]] = {
    "files": TypeAdapter(list[FileEntry]),
    "pieces": TypeAdapter(list[PieceEntry]),
    "links": TypeAdapter(dict[str, str]),
    "models": TypeAdapter(list[str]),
}


def read_artifacts(pieces_dir: Path) -> dict[str, Any]:
    """:data:`ARTIFACTS` of ``pieces_dir``, its format, fields and paths checked (:func:`check_paths`)."""
    path = pieces_dir / ARTIFACTS
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        got = record.get("format") if isinstance(record, dict) else None
        raise ArtifactError(f"{path}: format must be {FORMAT}, got {got!r}")
    for key, kind in (("files", list), ("pieces", list), ("links", dict), ("models", list), ("source", dict)):
        if not isinstance(record.get(key), kind):
            raise ArtifactError(f"{path}: field {key!r} must be a {kind.__name__}")
    for key, adapter in ENTRIES.items():
        try:
            adapter.validate_python(record[key])
        except ValidationError as exc:
            err = exc.errors()[0]
            where = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in err["loc"])
            raise ArtifactError(f"{path}: {key}{where}: {err['msg']}") from None
    check_paths(path, record)
    return record


def safe_relative(where: Path, name: str) -> PurePosixPath:
    """``name`` as a path that stays inside the folder it is unpacked into."""
    p = PurePosixPath(name)
    if "\0" in name or p.is_absolute() or ".." in p.parts or not p.parts:
        raise ArtifactError(f"{where}: path {name!r} would leave the loop folder")
    return p


def check_paths(where: Path, record: dict[str, Any]) -> None:
    """Every recorded path stays inside the loop folder before anything is written: files and link names are
    relative, without ``..``, recorded once, and reach no recorded link on their way (a file under a link, or a
    link under another, would be written wherever that link points); a link's target, walked from the link's
    folder, neither leaves the folder nor passes through a recorded link (what ``..`` after a link means depends on
    where the link points). :func:`pack` records only such paths."""
    links = {safe_relative(where, name): target for name, target in record["links"].items()}
    files = [safe_relative(where, f["path"]) for f in record["files"]]
    seen: set[PurePosixPath] = set()
    for name in files:
        if name in seen:
            raise ArtifactError(f"{where}: file {name.as_posix()!r} is recorded twice")
        seen.add(name)
    folders = {parent for name in [*files, *links] for parent in name.parents}
    for kind, names in (("file", files), ("link", list(links))):
        for name in names:
            if kind == "file" and name in links:
                raise ArtifactError(f"{where}: {name.as_posix()!r} is recorded as a file and as a link")
            through = next((p for p in name.parents if p in links), None)
            if through is not None:
                raise ArtifactError(f"{where}: {kind} {name.as_posix()!r} would be written through the link {through}")
            if kind == "file" and name in folders:
                raise ArtifactError(f"{where}: file {name.as_posix()!r} is also the folder of another recorded path")
    for name, target in links.items():
        walked = list(name.parent.parts)
        if "\0" in target or PurePosixPath(target).is_absolute() or not target:
            raise ArtifactError(f"{where}: link {name.as_posix()!r}: its target {target!r} would leave the loop folder")
        parts = PurePosixPath(target).parts
        for i, part in enumerate(parts):
            if part == "..":
                if not walked:
                    raise ArtifactError(
                        f"{where}: link {name.as_posix()!r}: its target {target!r} would leave the loop folder"
                    )
                walked.pop()
                continue
            walked.append(part)
            if i < len(parts) - 1 and PurePosixPath(*walked) in links:
                raise ArtifactError(
                    f"{where}: link {name.as_posix()!r}: its target {target!r} passes through the link "
                    f"{PurePosixPath(*walked)}"
                )


def find_pieces(pieces_dir: Path, pieces: list[dict[str, Any]]) -> list[Path]:
    """Every recorded piece, found by name anywhere under ``pieces_dir`` and checked (size, sha256), in order."""
    found: dict[str, list[Path]] = {}
    for p in pieces_dir.rglob("piece-*"):
        if p.is_file():
            found.setdefault(p.name, []).append(p)
    paths = []
    for piece in pieces:
        name, where = piece["name"], f"{piece['batch']}/{piece['name']}"
        candidates = found.get(name, [])
        if not candidates:
            raise ArtifactError(f"piece {name} ({where}) is missing under {pieces_dir}")
        if len(candidates) > 1:
            raise ArtifactError(f"piece {name} is there {len(candidates)} times: {sorted(map(str, candidates))}")
        paths.append(check_piece(candidates[0], piece))
    return paths


def check_piece(path: Path, piece: dict[str, Any]) -> Path:
    size = path.stat().st_size
    if size != piece["size"]:
        raise ArtifactError(f"piece {piece['name']} ({path}): {size} bytes, {ARTIFACTS} records {piece['size']}")
    digest = sha256_file(path)
    if digest != piece["sha256"]:
        raise ArtifactError(
            f"piece {piece['name']} ({path}): sha256 {digest} is not the recorded {piece['sha256']} (corrupt, or a "
            "piece of another pack)"
        )
    return path


class PieceReader(io.RawIOBase):
    """The pieces read one after the other as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__()
        self.paths = iter(paths)
        self.fh: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunks, want = [], size if size >= 0 else float("inf")
        while want > 0:
            if self.fh is None:
                path = next(self.paths, None)
                if path is None:
                    break
                self.fh = path.open("rb")
            data = self.fh.read(int(min(want, CHUNK)))
            if not data:
                self.fh.close()
                self.fh = None
                continue
            chunks.append(data)
            want -= len(data)
        return b"".join(chunks)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
        super().close()


def unpack(pieces_dir: Path, workdir: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Rebuild the loop folder packed under ``pieces_dir`` as ``workdir`` (new or empty), every piece and file
    checked by sha256, the old folder's recorded paths rewritten to ``workdir``; returns the manifest's
    ``unpacked`` entry (which files were rewritten). ``progress`` is called after every write."""
    record = read_artifacts(pieces_dir)
    paths = find_pieces(pieces_dir, record["pieces"])  # every piece checked before anything is written
    refuse_non_empty(workdir, "the new loop folder")
    root = workdir.resolve()
    extract(paths, root, {f["path"]: f for f in record["files"]}, progress)
    for name, target in record["links"].items():
        make_link(root, name, target)
    rewritten = rewrite_paths(root, record)
    entry = {
        "from": record["source"]["workdir"],
        "commit": record.get("commit"),
        "packed": record.get("created"),
        "pieces": len(record["pieces"]),
        "rewritten": rewritten,
    }
    record_file = root / MANIFEST
    manifest = RunRecord(record_file, read_json(record_file) or {})
    manifest.set("unpacked", [*manifest.data.get("unpacked", []), entry])
    return entry


def extract(paths: list[Path], root: Path, files: dict[str, dict[str, Any]], progress: Progress | None) -> None:
    """Every recorded file out of the stream into ``root``, each checked by size and sha256; a member that is
    not a recorded file, or a recorded file not in the stream, is an error."""
    seen: set[str] = set()
    total = sum(f["size"] for f in files.values())
    try:
        with PieceReader(paths) as reader, tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                want = files.get(member.name)
                if want is None or not member.isfile() or member.name in seen:
                    raise ArtifactError(
                        f"the stream holds {member.name!r}, which is not a file {ARTIFACTS} records once"
                    )
                src = tar.extractfile(member)
                assert src is not None
                write_checked(src, root / member.name, want, progress, total)
                os.utime(root / member.name, (member.mtime, member.mtime))
                seen.add(member.name)
    except tarfile.TarError as exc:
        raise ArtifactError(f"the pieces do not hold a readable stream ({exc})") from None
    missing = sorted(set(files) - seen)
    if missing:
        raise ArtifactError(f"{len(missing)} recorded file(s) not in the pieces, first {missing[0]}")


def write_checked(src: Any, dest: Path, want: dict[str, Any], progress: Progress | None, total: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    h, size = hashlib.sha256(), 0
    with dest.open("wb") as fh:
        for chunk in iter(lambda: src.read(CHUNK), b""):
            fh.write(chunk)
            h.update(chunk)
            size += len(chunk)
            if progress is not None:
                progress(len(chunk), total)
    if size != want["size"] or h.hexdigest() != want["sha256"]:
        dest.unlink()  # a file that is not the recorded one is not left behind
        raise ArtifactError(
            f"file {want['path']}: {size} bytes, sha256 {h.hexdigest()}; {ARTIFACTS} records {want['size']} bytes, "
            f"sha256 {want['sha256']}"
        )


def make_link(root: Path, name: str, target: str) -> None:
    link = root / name
    if not (link.parent / target).resolve().is_relative_to(root):
        raise ArtifactError(f"link {name}: its target {target} would leave the loop folder")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def old_paths(record: dict[str, Any]) -> re.Pattern[str]:
    """The source folder's recorded forms, matched where a path starts and up to a path boundary."""
    forms = sorted({record["source"]["workdir"], *record["source"].get("recorded_as", [])}, key=len, reverse=True)
    return re.compile(r"(?<![\w.\-/])(?:" + "|".join(map(re.escape, forms)) + r")(?![\w.\-])")


def rewrite_paths(root: Path, record: dict[str, Any]) -> list[str]:
    """The old folder's paths in the JSON files outside the exported models, rewritten to ``root``; the files
    it changed."""
    pattern, new = old_paths(record), str(root)
    models = [PurePosixPath(m) for m in record["models"]]
    changed = []
    for f in record["files"]:
        name = PurePosixPath(f["path"])
        if name.suffix != ".json" or any(name.is_relative_to(m) for m in models):
            continue
        data = read_json(root / name)
        moved = rewrite(data, pattern, new)
        if moved != data:
            (root / name).write_text(json.dumps(moved, indent=2, ensure_ascii=False) + "\n")
            changed.append(f["path"])
    return changed


def rewrite(value: Any, pattern: re.Pattern[str], new: str) -> Any:
    """``value`` with every string (and key) path under the old folder moved under ``new``."""
    if isinstance(value, str):
        return pattern.sub(lambda _m: new, value)
    if isinstance(value, list):
        return [rewrite(v, pattern, new) for v in value]
    if isinstance(value, dict):
        return {rewrite(k, pattern, new): rewrite(v, pattern, new) for k, v in value.items()}
    return value

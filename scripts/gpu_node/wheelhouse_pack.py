"""Pack files into size-limited chunk folders with a sha256 manifest, and put them back together.

Standard library only: the unpacking side runs on a bare GPU node before anything is installed.

Layout written by :func:`pack` (one folder per transfer, each at most ``chunk_bytes`` of payload)::

    OUT/chunk-000/manifest.json   # the same manifest in every chunk, so any one tells what is missing
    OUT/chunk-000/blob.000        # slice 0 of the concatenated payloads
    OUT/chunk-001/manifest.json
    OUT/chunk-001/blob.001
    ...

All payloads are concatenated into one stream that is cut at ``chunk_bytes``, so no chunk is left half
empty. A large wheel may be stored as an xz-compressed tar of its members (``encoding
"wheel-tar-xz"``): zip's deflate leaves native libraries compressible. It is rebuilt into a wheel on
the node and every member is checked against the wheel's own ``RECORD`` hashes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

FORMAT = 1
MANIFEST = "manifest.json"
_BUF = 1 << 20


class PackError(RuntimeError):
    """A chunk is missing, truncated or corrupt, or a restored file fails its checksum."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_BUF), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Entry:
    """One file of the pack: where its payload sits in the stream and how to check it."""

    name: str
    kind: str  # wheel | gguf | extra
    size: int
    sha256: str
    encoding: str  # raw | wheel-tar-xz
    offset: int = 0
    payload_size: int = 0
    payload_sha256: str = ""
    members: int = 0  # files in the wheel (wheel-tar-xz): a rebuilt wheel must have exactly these
    members_sha256: str = ""  # of their sorted names


@dataclass
class Part:
    chunk: str
    name: str
    size: int
    sha256: str


# ---- building ----------------------------------------------------------------------------------


def wheel_to_tar_xz(wheel: Path, dest: Path, preset: int = 6) -> None:
    """The wheel's members, in its order, as an xz-compressed tar (a wheel's deflate leaves .so files
    compressible; xz takes about a quarter off vLLM's)."""
    with (
        zipfile.ZipFile(wheel) as zf,
        lzma.open(dest, "wb", preset=preset) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for info in zf.infolist():
            if info.is_dir():
                continue
            ti = tarfile.TarInfo(info.filename)
            ti.size = info.file_size
            ti.mode = (info.external_attr >> 16) & 0o777 or 0o644
            ti.mtime = 0
            with zf.open(info) as src:
                tar.addfile(ti, src)


def _xz_payload(path: Path, workdir: Path, cache: Path | None) -> Path:
    """The wheel as tar.xz; kept in ``cache`` under the wheel's sha256 (compressing vLLM takes minutes)."""
    if cache is not None:
        cached = cache / f"{sha256_file(path)}.tar.xz"
        if not cached.is_file():
            tmp = cache / (cached.name + ".part")
            wheel_to_tar_xz(path, tmp)
            os.replace(tmp, cached)
        return cached
    out = workdir / (path.name + ".tar.xz")
    wheel_to_tar_xz(path, out)
    return out


def pack(
    files: Iterable[tuple[Path, str]],
    out: Path,
    chunk_bytes: int,
    xz_min_bytes: int | None = None,
    meta: dict[str, Any] | None = None,
    xz_cache: Path | None = None,
) -> dict[str, Any]:
    """Write ``files`` ((path, kind) pairs) as chunk folders under ``out`` (replaced) and return the
    manifest. Wheels of at least ``xz_min_bytes`` are stored xz-compressed when that is smaller (the
    compressed copies are kept in ``xz_cache`` if given)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    entries: list[Entry] = []
    parts: list[Part] = []
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        writer = _ChunkWriter(out, chunk_bytes, parts)
        for path, kind in files:
            encoding = "raw"
            payload = path
            if kind == "wheel" and xz_min_bytes is not None and path.stat().st_size >= xz_min_bytes:
                if xz_cache is not None:
                    xz_cache.mkdir(parents=True, exist_ok=True)
                candidate = _xz_payload(path, Path(tmp), xz_cache)
                if candidate.stat().st_size < path.stat().st_size:
                    encoding, payload = "wheel-tar-xz", candidate
            e = Entry(path.name, kind, path.stat().st_size, sha256_file(path), encoding, offset=writer.offset)
            if encoding == "wheel-tar-xz":
                e.members, e.members_sha256 = _member_names_digest(path)
            h = hashlib.sha256()
            with payload.open("rb") as f:
                for block in iter(lambda: f.read(_BUF), b""):
                    h.update(block)
                    writer.write(block)
            e.payload_size = writer.offset - e.offset
            e.payload_sha256 = h.hexdigest()
            entries.append(e)
            if payload != path and payload.parent == Path(tmp):
                payload.unlink()
        writer.close()
    if len({e.name for e in entries}) != len(entries):
        raise PackError("two files share a name")
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "chunk_bytes": chunk_bytes,
        "stream_size": sum(p.size for p in parts),
        "files": [asdict(e) for e in entries],
        "parts": [asdict(p) for p in parts],
        **(meta or {}),
    }
    text = json.dumps(manifest, indent=1) + "\n"
    for p in parts:
        (out / p.chunk / MANIFEST).write_text(text)
    return manifest


class _ChunkWriter:
    """Cuts one byte stream into ``blob.NNN`` files, one per ``chunk-NNN`` folder."""

    def __init__(self, out: Path, chunk_bytes: int, parts: list[Part]) -> None:
        self.out, self.chunk_bytes, self.parts = out, chunk_bytes, parts
        self.offset = 0
        self._f: BinaryIO | None = None
        self._h = hashlib.sha256()
        self._size = 0

    def _open(self) -> BinaryIO:
        if self._f is None:
            i = len(self.parts)
            folder = self.out / f"chunk-{i:03d}"
            folder.mkdir()
            self._f = (folder / f"blob.{i:03d}").open("wb")
            self._h, self._size = hashlib.sha256(), 0
        return self._f

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            f = self._open()
            take = min(len(view), self.chunk_bytes - self._size)
            f.write(view[:take])
            self._h.update(view[:take])
            self._size += take
            self.offset += take
            view = view[take:]
            if self._size == self.chunk_bytes:
                self._finish()

    def _finish(self) -> None:
        if self._f is None:
            return
        i = len(self.parts)
        self._f.close()
        self.parts.append(Part(f"chunk-{i:03d}", f"blob.{i:03d}", self._size, self._h.hexdigest()))
        self._f = None

    def close(self) -> None:
        self._finish()


# ---- restoring ---------------------------------------------------------------------------------


def find_manifest(staging: Path) -> dict[str, Any]:
    """The manifest of the chunks under ``staging`` (any chunk's copy; they must all agree)."""
    found = sorted(staging.rglob(MANIFEST))
    if not found:
        raise PackError(f"no {MANIFEST} under {staging}: copy the chunk folders there first")
    texts = {p.read_text() for p in found}
    if len(texts) != 1:
        raise PackError(f"the chunks under {staging} come from different builds (their manifests differ)")
    manifest: dict[str, Any] = json.loads(texts.pop())
    if manifest.get("format") != FORMAT:
        raise PackError(f"manifest format {manifest.get('format')!r}, this script reads {FORMAT}")
    return manifest


def locate_parts(staging: Path, manifest: dict[str, Any], check: bool = True) -> list[Path]:
    """Every blob part, found anywhere under ``staging``; names what is missing or damaged."""
    paths, problems = [], []
    for p in manifest["parts"]:
        hits = sorted(staging.rglob(p["name"]))
        if not hits:
            problems.append(f"{p['chunk']}/{p['name']} missing")
            continue
        path = hits[0]
        if path.stat().st_size != p["size"]:
            problems.append(f"{p['chunk']}/{p['name']} has {path.stat().st_size} bytes, expected {p['size']}")
        elif check and sha256_file(path) != p["sha256"]:
            problems.append(f"{p['chunk']}/{p['name']} sha256 mismatch")
        paths.append(path)
    if problems:
        raise PackError("; ".join(problems))
    return paths


class _StreamReader:
    """Reads the concatenation of the blob parts as one stream."""

    def __init__(self, parts: list[Path]) -> None:
        self._parts = iter(parts)
        self._f: BinaryIO | None = None

    def read_exact(self, n: int) -> Iterator[bytes]:
        while n > 0:
            if self._f is None:
                nxt = next(self._parts, None)
                if nxt is None:
                    raise PackError("the chunk stream ended early")
                self._f = nxt.open("rb")
            block = self._f.read(min(n, _BUF))
            if not block:
                self._f.close()
                self._f = None
                continue
            n -= len(block)
            yield block

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        raise PackError("wheel has no RECORD")
    rows = csv.reader(io.TextIOWrapper(zf.open(record), encoding="utf-8"))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}


def _member_names_digest(wheel: Path) -> tuple[int, str]:
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(i.filename for i in zf.infolist() if not i.is_dir())
    return len(names), hashlib.sha256("\n".join(names).encode()).hexdigest()


def verify_wheel_members(wheel: Path, expect: tuple[int, str] | None = None) -> None:
    """Every member of the wheel that its RECORD lists matches the hash given there (some wheels, such
    as Ray's, list files they do not contain); with ``expect``, the member names are exactly those."""
    if expect is not None and _member_names_digest(wheel) != expect:
        raise PackError(f"{wheel.name}: the rebuilt wheel's members differ from the original's")
    with zipfile.ZipFile(wheel) as zf:
        present = set(zf.namelist())
        for name, digest in _record_hashes(zf).items():
            if name not in present:
                continue
            algo, _, want = digest.partition("=")
            h = hashlib.new(algo)
            with zf.open(name) as f:
                for block in iter(lambda: f.read(_BUF), b""):
                    h.update(block)
            got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if got != want:
                raise PackError(f"{wheel.name}: {name} does not match its RECORD hash")


def tar_xz_to_wheel(src: Path, wheel: Path) -> None:
    """Rebuild a wheel from :func:`wheel_to_tar_xz` output (stored, not deflated: pip only unpacks it)."""
    with (
        lzma.open(src, "rb") as xz,
        tarfile.open(fileobj=xz, mode="r|") as tar,
        zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf,
    ):
        for ti in tar:
            if not ti.isfile():
                continue
            f = tar.extractfile(ti)
            if f is None:
                continue
            zi = zipfile.ZipInfo(ti.name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (ti.mode & 0o777) << 16
            with zf.open(zi, "w", force_zip64=ti.size > 0x7FFFFFFF) as dst:
                shutil.copyfileobj(f, dst, _BUF)


def restore(staging: Path, dest: Path) -> dict[str, Any]:
    """Reassemble every file of the pack under ``staging`` into ``dest`` and check it. A file already in
    ``dest`` that passes its check is kept (so a second run only verifies)."""
    manifest = find_manifest(staging)
    dest.mkdir(parents=True, exist_ok=True)
    files = [Entry(**e) for e in manifest["files"]]
    if all(_restored_ok(dest, e) for e in files):
        return manifest
    reader = _StreamReader(locate_parts(staging, manifest))
    try:
        pos = 0
        for e in sorted(files, key=lambda x: x.offset):
            if e.offset != pos:
                raise PackError(f"manifest offsets are not contiguous at {e.name}")
            pos += e.payload_size
            with tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
                h = hashlib.sha256()
                for block in reader.read_exact(e.payload_size):
                    h.update(block)
                    tmp.write(block)
            payload = Path(tmp.name)
            if h.hexdigest() != e.payload_sha256:
                payload.unlink()
                raise PackError(f"{e.name}: payload sha256 mismatch (a chunk is corrupt)")
            target = dest / e.name
            if e.encoding == "raw":
                os.replace(payload, target)
            elif e.encoding == "wheel-tar-xz":
                tar_xz_to_wheel(payload, target)
                payload.unlink()
                verify_wheel_members(target, (e.members, e.members_sha256))
            else:
                raise PackError(f"{e.name}: unknown encoding {e.encoding!r}")
            _stamp(dest, e).write_text(sha256_file(target))
    finally:
        reader.close()
    bad = [e.name for e in files if not _restored_ok(dest, e)]
    if bad:
        raise PackError(f"restored files fail their check: {bad}")
    return manifest


def _stamp(dest: Path, e: Entry) -> Path:
    return dest / f".{e.name}.{e.payload_sha256[:16]}.ok"


def _restored_ok(dest: Path, e: Entry) -> bool:
    """Raw files must equal the original's sha256; a rebuilt wheel must equal what was verified."""
    target = dest / e.name
    if not target.is_file():
        return False
    if e.encoding == "raw":
        return target.stat().st_size == e.size and sha256_file(target) == e.sha256
    stamp = _stamp(dest, e)
    return stamp.is_file() and stamp.read_text() == sha256_file(target)

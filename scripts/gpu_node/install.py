"""Install the carried wheelhouse on an air-gapped GPU node (standard library only; docs/airgap.md).

    python3 scripts/gpu_node/install.py --staging DIR (--target DIR | --venv DIR) [--cache-dir DIR]

``DIR`` holds the chunk folders of ``build_wheelhouse.py`` (``chunk-NNN/``, copied by any means, in
any layout below it). The script reassembles and checks every file (sha256; rebuilt wheels against
their RECORD), installs the wheels with ``pip install --no-index --no-deps`` into ``--target`` (use
it with ``PYTHONPATH``) or into a ``--venv`` that sees the node's own packages, puts the GGUF into the
project's model cache, and prints the versions that matter. A second run finds everything in place
and only verifies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from wheelhouse_pack import PackError, restore  # a sibling file: this runs as a script

VERSIONS = ("vllm", "ray", "verl", "torch", "transformers", "fastapi", "pydantic", "tensordict")


def default_cache_dir() -> Path:
    """The project's cache (``services.executor_vllm.default_model.cache_dir``)."""
    return Path(os.environ.get("STX_CACHE_DIR", Path.home() / ".cache" / "schema-table-rl"))


def pip_install_cmd(python: str, wheels: list[Path], target: Path | None) -> list[str]:
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    if target is not None:
        cmd += ["--upgrade", "--target", str(target)]
    return cmd + [str(w) for w in sorted(wheels)]


def restore_exec_bits(wheels: list[Path], target: Path) -> int:
    """Give every file a wheel marks executable (zip mode bits) its bits back under ``target``.

    Measured on an H200 node (torch 2.11 image): after ``pip install --target``, Ray's own binaries
    (``ray/core/src/ray/gcs/gcs_server``, ``raylet``) were not executable and ``ray.init`` failed with
    ``PermissionError``, although the wheel stores them as 0755. Returns how many files were changed.
    """
    changed = 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                mode = (info.external_attr >> 16) & 0o777
                path = target / info.filename
                if mode & 0o111 and path.is_file() and (path.stat().st_mode & 0o111) != (mode & 0o111):
                    path.chmod(path.stat().st_mode | (mode & 0o111))
                    changed += 1
    return changed


def install(staging: Path, target: Path | None, venv: Path | None, cache_dir: Path, files_dir: Path) -> Path:
    """Reassemble, verify and install; returns the Python to use (the venv's or this one)."""
    t0 = time.monotonic()
    manifest = restore(staging, files_dir)
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    print(f"restored and verified {len(manifest['files'])} files in {time.monotonic() - t0:.1f} s", flush=True)
    wheels = [files_dir / f["name"] for f in manifest["files"] if f["kind"] == "wheel"]
    python = sys.executable
    if venv is not None:
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        done = venv / ".stx-wheelhouse"
    else:
        assert target is not None
        target.mkdir(parents=True, exist_ok=True)
        done = target / ".stx-wheelhouse"
    if done.is_file() and done.read_text() == digest:
        print(f"already installed ({done})")
    else:
        t1 = time.monotonic()
        subprocess.run(pip_install_cmd(python, wheels, target if venv is None else None), check=True)
        if venv is None:
            assert target is not None
            print(f"executable bits restored on {restore_exec_bits(wheels, target)} files", flush=True)
        done.write_text(digest)
        print(f"installed {len(wheels)} wheels in {time.monotonic() - t1:.1f} s", flush=True)
    for f in manifest["files"]:
        if f["kind"] == "gguf":
            dest = cache_dir / "gguf" / f["name"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                try:
                    os.link(files_dir / f["name"], dest)
                except OSError:  # another file system
                    shutil.copy2(files_dir / f["name"], dest)
            print(f"GGUF in the model cache: {dest}")
    return Path(python)


def print_versions(python: Path, target: Path | None) -> int:
    code = (
        "import importlib.metadata as m\n"
        f"for n in {VERSIONS!r}:\n"
        "    try: print(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: print(f'{n} MISSING')\n"
        "import vllm, ray, verl  # noqa: the imports that fail when a carried dependency is missing\n"
    )
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([str(python), "-c", code], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--staging", type=Path, required=True, help="Folder holding the chunk folders.")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", type=Path, help="pip --target folder (then export PYTHONPATH=it).")
    where.add_argument("--venv", type=Path, help="A venv (created with --system-site-packages if absent).")
    ap.add_argument("--files-dir", type=Path, default=None, help="Where restored files go (default STAGING/files).")
    ap.add_argument("--cache-dir", type=Path, default=None, help="Project cache for the GGUF ($STX_CACHE_DIR).")
    ap.add_argument("--no-check", action="store_true", help="Skip the import check of vllm, ray and verl.")
    a = ap.parse_args(argv)
    try:
        python = install(
            a.staging, a.target, a.venv, a.cache_dir or default_cache_dir(), a.files_dir or a.staging / "files"
        )
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if a.no_check else print_versions(python, a.target)


if __name__ == "__main__":
    raise SystemExit(main())

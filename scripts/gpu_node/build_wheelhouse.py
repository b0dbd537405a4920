"""Build the wheelhouse for an air-gapped GPU node, here (where PyPI is reachable), in chunks.

    python3 scripts/gpu_node/build_wheelhouse.py [--out .gpu_wheelhouse] [--chunk-mb 48] [--dry-run]

Steps (docs/airgap.md): resolve what ``wheelhouse.toml`` asks for, for the node's Python and platform,
minus what the node's image already has and the GPU kernel packages we do not carry; download those
wheels; add the default model's GGUF (so ``python -m services.executor_vllm.default_model`` converts it
there with no network) and any ``--extra`` files; pack everything into ``OUT/chunks/chunk-NNN`` folders
of at most ``--chunk-mb`` MB with a sha256 manifest. Downloads are kept in ``OUT/cache`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from wheelhouse_pack import pack, sha256_file  # a sibling file: this runs as a script

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_CONFIG = HERE / "wheelhouse.toml"
DEFAULT_OUT = REPO / ".gpu_wheelhouse"
TRAINER_REQUIREMENTS = REPO / "trainer" / "requirements-gpu.txt"


@dataclass
class Config:
    python_version: str
    abi: str
    platforms: list[str]
    requirements: list[str]
    no_deps: list[str]
    expand_deps: list[str]
    drop_from_expanded: set[str]
    sdist_only: list[str]
    node_pins: list[str]
    node_provided: set[str]
    not_carried: set[str]
    extra_requirement_files: list[Path] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, requirement_files: Iterable[Path] = ()) -> Config:
        raw = tomllib.loads(path.read_text())
        return cls(
            python_version=raw["target"]["python_version"],
            abi=raw["target"]["abi"],
            platforms=list(raw["target"]["platforms"]),
            requirements=list(raw["packages"]["requirements"]),
            no_deps=list(raw["packages"].get("no_deps", [])),
            expand_deps=list(raw["packages"].get("expand_deps", [])),
            drop_from_expanded={canonicalize_name(n) for n in raw["packages"].get("drop_from_expanded", [])},
            sdist_only=list(raw["packages"].get("sdist_only", [])),
            node_pins=list(raw["node"].get("pins", [])),
            node_provided={canonicalize_name(n) for n in raw["node"]["provided"]},
            not_carried={canonicalize_name(n) for n in raw["not_carried"]["names"]},
            extra_requirement_files=list(requirement_files),
        )

    def skipped(self, name: str) -> bool:
        n = canonicalize_name(name)
        return n in self.node_provided or n in self.not_carried

    def platform_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp"]
        args += ["--abi", self.abi, "--abi", "abi3", "--abi", "none"]
        for p in self.platforms:
            args += ["--platform", p]
        return args

    def marker_env(self) -> dict[str, str]:
        env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
        env.update(
            python_version=self.python_version,
            python_full_version=f"{self.python_version}.0",
            implementation_name="cpython",
            platform_python_implementation="CPython",
            sys_platform="linux",
            platform_system="Linux",
            platform_machine="x86_64",
            os_name="posix",
        )
        return env


def read_requirement_file(path: Path) -> list[str]:
    """Requirement lines of a pip requirements file (comments and blanks dropped)."""
    out = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text and not text.startswith("-"):
            out.append(text)
    return out


def expanded_dependencies(wheel: Path, cfg: Config) -> list[str]:
    """The wheel's own Requires-Dist for the node (markers evaluated, extras ignored), without what the
    node has or what we do not carry."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    env = cfg.marker_env()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        if cfg.skipped(req.name) or canonicalize_name(req.name) in cfg.drop_from_expanded:
            continue
        req.marker = None
        out.append(str(req))
    return out


def top_level_requirements(cfg: Config, expanded: dict[str, list[str]]) -> list[str]:
    """What the resolver gets: the configured requirements (the expanded packages replaced by their
    filtered dependencies) and the trainer's GPU requirements, minus what the node has."""
    expand_names = {canonicalize_name(Requirement(r).name) for r in cfg.expand_deps}
    reqs: list[str] = []
    for r in cfg.requirements:
        if canonicalize_name(Requirement(r).name) in expand_names:
            continue
        reqs.append(r)
    for deps in expanded.values():
        reqs += deps
    for f in cfg.extra_requirement_files:
        reqs += read_requirement_file(f)
    return [r for r in dict.fromkeys(reqs) if not cfg.skipped(Requirement(r).name)]


def select(report: dict[str, Any], cfg: Config) -> list[tuple[str, str]]:
    """(name, version) of every resolved package to download: not on the node, not a placeholder."""
    picked = []
    for item in report["install"]:
        m = item["metadata"]
        if cfg.skipped(m["name"]) or "+stx.node" in m["version"]:
            continue
        picked.append((m["name"], m["version"]))
    return sorted(picked, key=lambda x: canonicalize_name(x[0]))


def placeholder_wheel(folder: Path, pin: str) -> Path:
    """A metadata-only wheel that tells pip's resolver "this is on the node" (never installed): a local
    version ``+stx.node`` so it wins over the real build of the same version."""
    req = Requirement(pin)
    (spec,) = list(req.specifier)
    version = f"{spec.version}+stx.node"
    dist = req.name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {req.name}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: stx\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def pip(*args: str, dry_run: bool = False) -> None:
    """pip against the public index only (the machine's extra local indexes hold CPU builds)."""
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    if dry_run:
        return
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    env["PIP_CONFIG_FILE"] = os.devnull
    subprocess.run(cmd, check=True, env=env)


def _gguf_source() -> Any:
    """:mod:`services.executor_vllm.gguf_source` (standard library only, so this script needs no venv)."""
    sys.path.insert(0, str(REPO))
    from services.executor_vllm import gguf_source

    return gguf_source


def gguf_file() -> Path:
    return Path(_gguf_source().fetch_gguf())


def build(
    cfg: Config,
    out: Path,
    chunk_bytes: int,
    xz_min_bytes: int | None,
    extras: list[Path],
    with_gguf: bool = True,
    dry_run: bool = False,
) -> dict[str, Any] | None:
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    plat = cfg.platform_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "local"
        local.mkdir()
        for pin in cfg.node_pins:
            placeholder_wheel(local, pin)
        if cfg.sdist_only:
            pip("wheel", "-q", "--no-deps", "-w", str(cache), *cfg.sdist_only, dry_run=dry_run)
            for w in cache.glob("*-py*-none-any.whl"):
                shutil.copy2(w, local)
        pip("download", "-q", "--no-deps", "-d", str(cache), *plat, *cfg.expand_deps, *cfg.no_deps, dry_run=dry_run)
        if dry_run:
            if with_gguf:
                print(f"+ gguf: {_gguf_source().describe()}")
            print("(dry run: resolution and packing skipped)")
            return None
        expanded = {r: expanded_dependencies(_wheel_for(cache, r), cfg) for r in cfg.expand_deps}
        reqs = top_level_requirements(cfg, expanded)
        report_path = Path(tmp) / "report.json"
        pip(
            "install", "-q", "--dry-run", "--ignore-installed", "--report", str(report_path),
            "--find-links", str(local), "--target", str(Path(tmp) / "t"), *plat, *reqs,
        )  # fmt: skip
        picked = select(json.loads(report_path.read_text()), cfg)
        pins = [f"{n}=={v}" for n, v in picked]
        pip("download", "-q", "--no-deps", "-d", str(cache), "--find-links", str(local), *plat, *pins)
    wheels = [_wheel_for(cache, p) for p in pins + cfg.expand_deps + cfg.no_deps]
    files: list[tuple[Path, str]] = [(w, "wheel") for w in dict.fromkeys(wheels)]
    if with_gguf:
        files.append((gguf_file(), "gguf"))
    files += [(p, "extra") for p in extras]
    meta = {
        "target": {"python": cfg.python_version, "platforms": cfg.platforms},
        "not_carried": sorted(cfg.not_carried),
        "requirements": reqs,
    }
    manifest = pack(files, out / "chunks", chunk_bytes, xz_min_bytes, meta, xz_cache=out / "xz-cache")
    total = sum(f["size"] for f in manifest["files"])
    print(
        f"{len(manifest['files'])} files, {total / 1e6:.1f} MB → {manifest['stream_size'] / 1e6:.1f} MB in "
        f"{len(manifest['parts'])} chunks of ≤ {chunk_bytes / 1e6:.0f} MB under {out / 'chunks'}"
    )
    return manifest


def _wheel_for(cache: Path, pin: str) -> Path:
    req = Requirement(pin)
    (spec,) = list(req.specifier)
    stem = canonicalize_name(req.name).replace("-", "_")
    for w in cache.glob("*.whl"):
        name, version = w.name.split("-")[:2]
        if canonicalize_name(name).replace("-", "_") == stem and version == spec.version:
            return w
    raise FileNotFoundError(f"no wheel for {pin} in {cache}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--requirements", type=Path, action="append", default=None,
                    help=f"Extra requirement files (default: {TRAINER_REQUIREMENTS.relative_to(REPO)}).")  # fmt: skip
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Output folder (git-ignored).")
    ap.add_argument(
        "--chunk-mb",
        type=float,
        default=48.0,
        # a transfer of at most 64 MiB holds a chunk and the repo tree: 60 MB chunks left the tree 7 MB, and
        # a 7.3 MB tree did not fit
        help="Largest chunk, MB (10^6 bytes).",
    )
    ap.add_argument("--xz-min-mb", type=float, default=20.0, help="xz wheels at least this big (0: never).")
    ap.add_argument("--extra", type=Path, action="append", default=[], help="Another file to carry.")
    ap.add_argument("--no-gguf", action="store_true", help="Leave out the default model's GGUF.")
    ap.add_argument("--dry-run", action="store_true", help="Print the pip commands and stop.")
    a = ap.parse_args(argv)
    cfg = Config.load(a.config, a.requirements if a.requirements is not None else [TRAINER_REQUIREMENTS])
    for p in a.extra:
        if not p.is_file():
            ap.error(f"--extra {p}: not a file")
    xz = int(a.xz_min_mb * 1e6) if a.xz_min_mb > 0 else None
    manifest = build(cfg, a.out, int(a.chunk_mb * 1e6), xz, a.extra, not a.no_gguf, a.dry_run)
    if manifest is not None:
        (a.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        print("sha256 of the manifest:", sha256_file(a.out / "manifest.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

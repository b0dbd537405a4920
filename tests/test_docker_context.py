"""Every COPY source of every Dockerfile is in the build context that .dockerignore leaves (an image
that cannot build would only show on a GPU host, where CI cannot pull the base image)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted(p for p in ROOT.glob("**/Dockerfile*") if ".venv" not in p.parts)


def included(path: str, rules: list[str]) -> bool:
    """.dockerignore semantics for this repository's pattern style: the last matching rule wins."""
    keep = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.rstrip("/")
        hit = fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or path == pattern
        if pattern.startswith("**/"):
            hit = hit or fnmatch.fnmatch(path.split("/")[-1], pattern[3:])
        if hit:
            keep = negate
    return keep


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"\s*COPY\s+(?!--from)(?:--\S+\s+)*(.+)", line)
        if m:
            *srcs, _dest = m.group(1).split()
            sources += srcs
    return sources


def test_rules_behave_like_dockerignore() -> None:
    rules = ["*", "!shared/", "**/__pycache__"]
    assert included("shared/x.py", rules) and not included("trainer/x.py", rules)
    assert not included("shared/__pycache__", rules)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_copy_sources_are_in_the_build_context(dockerfile: Path) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [r.strip() for r in lines if r.strip() and not r.startswith("#")]
    name = dockerfile.relative_to(ROOT)
    for src in copy_sources(dockerfile):
        assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path"
        assert included(src.rstrip("/"), rules), f"{name}: COPY {src} is excluded by .dockerignore"

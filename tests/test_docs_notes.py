"""The notes that code and docs cite live in the repository (docs/notes/), not only beside a checkout."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITING = ("trainer", "services", "shared", "bench", "scripts", "tests", "docs", "deploy")


def test_every_cited_note_is_in_docs_notes() -> None:
    cited: dict[str, str] = {}
    for top in CITING:
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".py", ".md", ".yaml", ".sh") and path.is_file() and "docs/notes" not in path.as_posix():
                for name in re.findall(r"notes/([\w.-]+\.md)", path.read_text(errors="replace")):
                    cited.setdefault(name, path.relative_to(REPO).as_posix())
    assert cited, "no note is cited: the pattern or the tree changed"
    missing = {n: where for n, where in cited.items() if not (REPO / "docs" / "notes" / n).is_file()}
    assert not missing, f"cited but not in docs/notes/: {missing}"
    outside = "shared" + "/notes/"  # spelt apart: this file is searched too
    citing = [p for top in CITING for p in (REPO / top).rglob("*.py") if outside in p.read_text(errors="replace")]
    assert not citing, f"{citing}: cite docs/notes/, not ../{outside} (not in the repository)"

"""``make lint`` is what CI checks: .ci/run's lint step is ``make lint``, and it covers every Python folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_recipe() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe, "Makefile has no lint target"
    return [line.strip() for line in recipe.group(1).splitlines()]


def test_ci_lints_through_make_lint_only() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\s*make lint$", ci, re.MULTILINE), "CI's lint step must be `make lint`"
    assert not re.search(r"^\s*(\S*/)?(ruff|mypy)\s", ci, re.MULTILINE), (
        "CI runs ruff or mypy beside make lint: put the check in the Makefile's lint target"
    )


def test_make_lint_covers_every_python_folder() -> None:
    recipe = lint_recipe()
    assert ".venv/bin/ruff check ." in recipe
    mypy = next(line for line in recipe if line.startswith(".venv/bin/mypy "))
    checked = set(mypy.split()[1:])
    # every top-level folder with Python in it (hidden ones, .venv among them, aside); tests/ is ruff's only
    folders = {d.name for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".") and any(d.rglob("*.py"))}
    folders -= {"tests"}
    assert checked == folders, f"mypy checks {sorted(checked)}, the Python folders are {sorted(folders)}"

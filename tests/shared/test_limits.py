"""shared/limits.py: each answer's max new tokens, declared once (its readers: tests/test_max_tokens.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import shared
from shared import limits

KNOBS = ("SCHEMA_ANSWER_MAX_TOKENS", "TABLE_ANSWER_MAX_TOKENS", "EVAL_ANSWER_MAX_TOKENS")


def test_each_knob_is_a_positive_int_exported_by_shared() -> None:
    for name in KNOBS:
        value = getattr(limits, name)
        assert type(value) is int and value > 0, name
        assert name in shared.__all__ and getattr(shared, name) == value, name


def test_the_values() -> None:
    assert limits.SCHEMA_ANSWER_MAX_TOKENS == 256  # B1/C1 rollouts; the longest gold schema is 121 tokens
    assert limits.TABLE_ANSWER_MAX_TOKENS == 512  # B2/C2 rollouts and the reward API's executor; gold table 203
    assert limits.EVAL_ANSWER_MAX_TOKENS == 384  # Phase D, infer, precompute, preflight, RFT


def test_the_module_imports_the_standard_library_only() -> None:
    tree = ast.parse(Path(limits.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}

"""The reward audit at small size (CI): the defaults move no reward the wrong way, and the audit can fail
(the original positional reward is caught paying for null padding and punishing name formatting)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.common
from bench import reward_audit


def test_small_audit_defaults_clean_and_positional_caught(
    golden_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench.common, "RESULTS_DIR", tmp_path)
    payload = reward_audit.run(golden_dir, per_source=12, quick=True, seed=3)
    s = payload["summary"]
    assert set(payload["examples"]) == {"e2e", "rotowire_sent", "wikitabletext"}
    for reward in reward_audit.DEFAULT_REWARDS:
        assert s[reward]["wrong_way"] == 0, (reward, s[reward])
        assert s[reward]["applicable"] == payload["records"] > 0
    assert s["table_positional"]["edits"]["pad_null_columns"]["wrong_way"] > 0
    assert s["table_positional"]["edits"]["name_formatting"]["wrong_way"] > 0
    assert payload["goals"][0]["met"] is True
    written = json.loads((tmp_path / "reward_audit.quick.json").read_text())
    assert written["summary"]["table_aligned"]["wrong_way"] == 0
    md = (tmp_path / "reward_audit.quick.md").read_text()
    assert "| pad_null_columns | raise |" in md and "wikitabletext" in md


def test_an_audit_sees_a_reward_that_pays_for_padding() -> None:
    """wrong_way is what the audit counts: a raise after a worsening edit, a fall after an equivalent one."""
    assert reward_audit.wrong_way("worsening", 0.5, 0.6) and not reward_audit.wrong_way("worsening", 0.5, 0.5)
    assert reward_audit.wrong_way("equivalent", 0.5, 0.4) and not reward_audit.wrong_way("equivalent", 0.5, 0.9)

"""The smoke loop's checks of a loop folder: they pass on a complete one and name what is missing."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.smoke.grpo import Checks
from trainer.smoke.loop import PHASE_DIRS, RFT_DIRS, check_outputs


def loop_folder(out: Path, skip: str = "") -> None:
    manifest: dict[str, object] = {}
    hf: dict[str, str] = {}
    for name in PHASE_DIRS + RFT_DIRS:
        if name == skip:
            continue
        (out / name / "checkpoints" / "global_step_2").mkdir(parents=True)
        (out / name / "hf").mkdir()
        (out / name / "hf" / "config.json").write_text("{}")
        hf[name] = str(out / name / "hf")
        manifest.setdefault("phases", {})[name] = {"status": "ok", "hf_dir": hf[name]}  # type: ignore[union-attr]
    manifest["precompute:loop1"] = {"counts": {"train": 12}, "schema_model": hf.get("c1")}
    (out / "run.json").write_text(json.dumps(manifest))
    ev = out / "eval_loop1"
    ev.mkdir()
    settings = {"sft": ("a1", "a2"), "local": ("b1", "b2"), "pipe": ("c1", "c2"), "rft": RFT_DIRS}
    for s, (p1, p2) in settings.items():
        rows = [{"schema_prediction": "{}", "schema_model": hf.get(p1), "table_model": hf.get(p2)}] * 3
        (ev / f"predictions_{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (ev / "metrics.json").write_text(json.dumps({"settings": {s: {"overall": {"schema_f1": 0.5}} for s in settings}}))
    (ev / "report.md").write_text("# Phase D\n")


def test_complete_loop_folder_passes(tmp_path: Path) -> None:
    loop_folder(tmp_path)
    checks = Checks()
    metrics = check_outputs(tmp_path, checks)
    assert checks.failed == 0 and len(checks.results) == 8 + 1 + 4 + 1
    assert metrics["pipe"]["overall"]["schema_f1"] == 0.5
    without_rft = Checks()
    check_outputs(tmp_path, without_rft, rft=False)
    assert without_rft.failed == 0 and len(without_rft.results) == 6 + 1 + 3 + 1


def test_missing_phase_fails_its_checks_and_the_settings_that_use_it(tmp_path: Path) -> None:
    loop_folder(tmp_path, skip="c1")
    checks = Checks()
    check_outputs(tmp_path, checks, rft=False)
    failed = [n for n, ok, _d in checks.results if not ok]
    assert failed == [
        "c1: checkpoint and exported HF directory",
        "executor served the c1/c2 exports in Phase D (pipe)",
        "C2 schemas precomputed by π1ʳ-pipe (the C1 export)",
    ]

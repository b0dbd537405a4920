"""The bundled E2E sample: only E2E, split by meaning representation, rebuilt byte for byte from the
golden data, and shipped with its license and attribution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared import golden_filename, read_golden, validate_folder
from shared.golden import SPLITS, sha256_file
from trainer.data.e2e_sample import DEFAULT_SIZES, E2E_SAMPLE_DIR, MANIFEST, build, mr_key, select


def _manifest() -> dict:
    return json.loads((E2E_SAMPLE_DIR / MANIFEST).read_text())


def test_rebuilding_from_golden_gives_identical_files(golden_dir: Path, tmp_path: Path) -> None:
    m = _manifest()
    for name, digest in m["inputs"].items():
        assert sha256_file(golden_dir / name) == digest, f"golden {name} changed since the sample was built"
    build(golden_dir, tmp_path, m["sizes"], m["seed"])
    for split in SPLITS:
        name = golden_filename(split)
        stale = f"{E2E_SAMPLE_DIR / name} is stale: run python -m trainer.data.e2e_sample"
        assert (tmp_path / name).read_bytes() == (E2E_SAMPLE_DIR / name).read_bytes(), stale


def test_only_e2e_one_reference_per_mr_and_no_mr_shared_between_splits() -> None:
    stats = validate_folder(E2E_SAMPLE_DIR)
    assert [s.examples for s in stats] == [DEFAULT_SIZES[s] for s in SPLITS]
    assert {src for st in stats for src in st.sources} == {"e2e"}
    mrs: dict[str, set[str]] = {}
    for split in SPLITS:
        examples = read_golden(E2E_SAMPLE_DIR / golden_filename(split))
        assert all(ex.id.startswith("e2e-") and ex.split == split for ex in examples)
        keys = [mr_key(ex) for ex in examples]
        assert len(set(keys)) == len(keys), f"{split}: an MR appears twice"
        mrs[split] = set(keys)
    assert not mrs["train"] & mrs["test"]
    assert not mrs["train"] & mrs["validation"]
    assert not mrs["validation"] & mrs["test"]


def test_license_and_attribution_sit_beside_the_data() -> None:
    license_text = (E2E_SAMPLE_DIR / "LICENSE").read_text()
    attribution = (E2E_SAMPLE_DIR / "ATTRIBUTION.md").read_text()
    assert "CC BY-SA 4.0" in license_text and "creativecommons.org/licenses/by-sa/4.0" in license_text
    for needle in ("Novikova", "Dušek", "2017", "2019", "CC BY-SA 4.0", "Changes made"):
        assert needle in attribution, needle


def test_select_is_deterministic_and_names_the_limit(golden_dir: Path) -> None:
    examples = read_golden(golden_dir / golden_filename("test"))
    a = [ex.id for ex in select(examples, 20, "seed-a")]
    assert a == [ex.id for ex in select(examples, 20, "seed-a")]
    assert a != [ex.id for ex in select(examples, 20, "seed-b")]
    assert all(i.startswith("e2e-") for i in a)  # RotoWire lines of the same file are never taken
    with pytest.raises(ValueError, match="size: asked for 100000"):
        select(examples, 100_000, "seed-a")

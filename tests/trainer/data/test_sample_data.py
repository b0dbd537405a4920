"""The bundled sample is exactly what the generator produces, and valid golden data."""

from __future__ import annotations

from pathlib import Path

from shared import golden_filename, read_golden, validate_folder
from trainer.data.sample_data import SAMPLE_DIR, SPLIT_SIZES, write_sample


def test_regenerating_gives_identical_files(tmp_path: Path) -> None:
    for path in write_sample(tmp_path):
        committed = SAMPLE_DIR / path.name
        stale = f"{committed} is stale: run python -m trainer.data.sample_data"
        assert committed.read_bytes() == path.read_bytes(), stale


def test_sample_is_valid_and_varied() -> None:
    stats = validate_folder(SAMPLE_DIR)
    assert [s.examples for s in stats] == list(SPLIT_SIZES.values())
    test = read_golden(SAMPLE_DIR / golden_filename("test"))
    assert {s for st in stats for s in st.sources} == {"invoice", "product", "people"}
    rows = [len(ex.table.data) for ex in test]
    assert min(rows) == 1 and max(rows) >= 2  # single-row and multi-row tables
    train = read_golden(SAMPLE_DIR / golden_filename("train"))
    assert any(cell is None for ex in train for row in ex.table.data for cell in row)  # null cells occur

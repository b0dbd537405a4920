"""Documents shared between golden splits (shared/split_overlap.py, ``python -m shared validate``): an id in two
splits, or one text under two ids (whitespace and case aside), is found and named; strict mode refuses it; the
project's golden data holds exactly the overlaps docs/golden_data.md states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shared import golden_filename, read_golden, write_golden
from shared.cli import app
from shared.golden import SPLITS
from shared.split_overlap import (
    EmptySplitError,
    SplitOverlapError,
    check_not_empty,
    check_splits,
    find_overlaps,
    read_overlaps,
    text_key,
)
from trainer.data.sample_data import SAMPLE_DIR

# What overlapping_golden puts in train, and so what must be dropped from it
SHARED_ID = "invoice-test-000"  # a train row renamed to a test id (its text is another)
TEST_TEXT_ID = "product-train-900"  # product-test-004's text, upper case, whitespace changed
VALIDATION_TEXT_ID = "invoice-train-901"  # invoice-validation-003's text, tabs and newlines
DROPPED = [SHARED_ID, TEST_TEXT_ID, VALIDATION_TEXT_ID]


def rows(split: str) -> list[dict[str, Any]]:
    return [ex.to_json() for ex in read_golden(SAMPLE_DIR / golden_filename(split))]


def overlapping_golden(out: Path, empty: str | None = None) -> Path:
    """The bundled sample with three train rows that repeat held-out documents: one under a test id, two with a
    held-out text under a new id (case and whitespace changed); ``empty``: that split's file holds nothing."""
    out.mkdir(parents=True, exist_ok=True)
    data = {s: rows(s) for s in SPLITS}
    by_id = {r["id"]: r for s in SPLITS for r in data[s]}
    data["train"][2]["id"] = SHARED_ID
    test_doc = by_id["product-test-004"]
    val_doc = by_id["invoice-validation-003"]
    data["train"].append(test_doc | {"id": TEST_TEXT_ID, "text": "  " + test_doc["text"].upper().replace(" ", "   ")})
    data["train"].append(val_doc | {"id": VALIDATION_TEXT_ID, "text": val_doc["text"].replace(" ", "\t\n") + "\n"})
    for split in SPLITS:
        write_golden(out / golden_filename(split), [] if split == empty else data[split])
    return out


def test_text_key_ignores_whitespace_and_case_only() -> None:
    assert text_key("The  Quiet\tFan\nPRO ") == text_key("the quiet fan pro") == text_key("THE QUIET FAN PRO")
    assert text_key("the quiet fan pro") != text_key("the quiet fan pro.")
    assert text_key("Straße") == text_key("STRASSE")  # casefold, not lower


def test_shared_id_and_repeated_texts_are_found_counted_and_named(tmp_path: Path) -> None:
    found = read_overlaps(overlapping_golden(tmp_path))
    assert found.sizes == {"train": 14, "validation": 6, "test": 6}
    test = found.pair("train", "test")
    val = found.pair("train", "validation")
    assert test is not None and val is not None
    assert test.other_ids == ["invoice-test-000", "product-test-004"] and test.shared_ids == ["invoice-test-000"]
    assert test.base_ids == [SHARED_ID, TEST_TEXT_ID]
    assert val.other_ids == ["invoice-validation-003"] and val.base_ids == [VALIDATION_TEXT_ID]
    assert found.counts() == {"train~validation": 1, "train~test": 2, "validation~test": 0}
    assert found.train_drop == DROPPED and not found.clean
    recorded = found.as_dict(strict=False)
    assert recorded["dropped_train"] == {"count": 3, "ids": DROPPED}
    assert recorded["pairs"]["train~test"]["test_ids"] == ["invoice-test-000", "product-test-004"]
    assert recorded["repeats"]["train"] == {"texts": 0, "extra_rows": 0, "ids": []}


def test_clean_folders_and_repeats_within_a_split() -> None:
    found = read_overlaps(SAMPLE_DIR)
    assert found.clean and found.train_drop == [] and check_splits(found, strict=True) is found
    train = read_golden(SAMPLE_DIR / golden_filename("train"))
    twice = [*train, train[0].model_copy(update={"id": "copy-0", "text": train[0].text.lower()})]
    rep = find_overlaps({"train": twice}).repeats["train"]
    assert (rep.texts, rep.extra_rows, rep.ids) == (1, 1, [[train[0].id, "copy-0"]])


def test_validation_and_test_sharing_a_document_is_found_but_nothing_is_dropped() -> None:
    val, test = (read_golden(SAMPLE_DIR / golden_filename(s)) for s in ("validation", "test"))
    moved = [*test, val[0].model_copy(update={"id": "test-copy"})]
    found = find_overlaps({"train": read_golden(SAMPLE_DIR / golden_filename("train")), "validation": val,
                           "test": moved})  # fmt: skip
    assert found.counts()["validation~test"] == 1 and found.train_drop == []
    with pytest.raises(SplitOverlapError, match=r"validation~test: 1 test documents also in validation \(test-copy;"):
        check_splits(found, strict=True)


def test_strict_refusal_is_one_line_naming_the_ids(tmp_path: Path) -> None:
    found = read_overlaps(overlapping_golden(tmp_path))
    with pytest.raises(SplitOverlapError) as err:
        check_splits(found, strict=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("splits share documents (same id, or same sha256 of the text")
    assert "train~validation: 1 validation documents also in train (invoice-validation-003; train ids " in msg
    assert "train~test: 2 test documents also in train (invoice-test-000, product-test-004; train ids " in msg
    assert all(i in msg for i in DROPPED)


@pytest.mark.parametrize("split", SPLITS)
def test_an_empty_split_is_an_error(tmp_path: Path, split: str) -> None:
    folder = overlapping_golden(tmp_path, empty=split)
    with pytest.raises(EmptySplitError, match=rf"common_{split}_schemas.jsonl: the {split} split is empty"):
        check_not_empty(folder)
    with pytest.raises(EmptySplitError):
        read_overlaps(folder)


def test_validate_warns_with_counts_and_strict_fails(tmp_path: Path) -> None:
    folder = overlapping_golden(tmp_path)
    cli = CliRunner()
    res = cli.invoke(app, ["validate", str(folder)])
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "warning: documents shared (train~validation 1, train~test 2, validation~test 0); 3 train rows" in out
    assert "train~test: test ids invoice-test-000, product-test-004; train ids invoice-test-000, product-train-900" in (
        out
    )
    assert "ok: 26 examples valid" in out
    res = cli.invoke(app, ["validate", str(folder), "--strict-splits"])
    assert res.exit_code == 1
    assert "invalid: splits share documents" in res.output and "invoice-train-901" in res.output
    clean = cli.invoke(app, ["validate", str(SAMPLE_DIR), "--strict-splits"])
    assert clean.exit_code == 0 and "warning" not in clean.output


def test_the_projects_golden_data_has_the_stated_overlaps(golden_dir: Path) -> None:
    """10 RotoWire test documents and 24 validation documents repeat a train document (whitespace and case aside;
    the texts are equal as written too); no id is shared; 122 train texts occur more than once (121 twice, one three
    times: 123 extra rows), every one with different gold tables, so they are kept."""
    found = read_overlaps(golden_dir)
    assert found.counts() == {"train~validation": 24, "train~test": 10, "validation~test": 0}
    for other in ("validation", "test"):
        pair = found.pair("train", other)
        assert pair is not None and pair.shared_ids == []
        assert {i.split("-", 1)[0] for i in pair.other_ids} == {"rotowire_sent"}
    assert len(found.train_drop) == 34
    rep = found.repeats["train"]
    assert (rep.texts, rep.extra_rows) == (122, 123)
    assert sorted(len(g) for g in rep.ids).count(3) == 1

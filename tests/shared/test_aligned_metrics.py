import pytest

from shared import aligned_table_metrics

GOLD = [{"name": "Wall", "points": "9"}, {"name": "Beal", "points": "20"}]


def test_reordered_rows_are_perfect() -> None:
    m = aligned_table_metrics(list(reversed(GOLD)), GOLD, ["name", "points"])
    assert m.aligned_cell_accuracy == 1.0
    assert m.row_exact_match == 1.0
    assert (m.cell_precision, m.cell_recall, m.cell_f1) == (1.0, 1.0, 1.0)
    assert m.column_header_f1 == 1.0


def test_hand_computed_partial() -> None:
    # pred rows: Beal/20 (exact), Wall/8 (one wrong), Jr/3 (extra)
    pred = [{"name": "Beal", "points": "20"}, {"name": "Wall", "points": "8"}, {"name": "Jr", "points": "3"}]
    m = aligned_table_metrics(pred, GOLD, ["name", "points"])
    # 6 pred cells, 4 gold cells, tp = 3 (Beal, 20, Wall)
    assert m.cell_precision == pytest.approx(3 / 6)
    assert m.cell_recall == pytest.approx(3 / 4)
    assert m.cell_f1 == pytest.approx(2 * 0.5 * 0.75 / 1.25)
    # union cells: pair1 2, pair2 2, unpaired Jr row 2 → 6; correct 3
    assert m.aligned_cell_accuracy == pytest.approx(3 / 6)
    assert m.row_exact_match == pytest.approx(1 / 3)


def test_normalised_matching() -> None:
    pred = [{"Name": "wall.", "Points": " 9 "}]
    m = aligned_table_metrics(pred, [{"name": "Wall", "points": "9"}], ["name", "points"])
    assert m.cell_f1 == 0.5  # names always through normalize_name; "wall." != "Wall" exactly, "9" == " 9 "
    assert m.cell_f1_normalized == 1.0
    assert m.column_header_f1 == 0.0
    assert m.column_header_f1_normalized == 1.0


def test_empty_both() -> None:
    m = aligned_table_metrics([], [], [])
    assert m.aligned_cell_accuracy == 1.0 and m.cell_f1 == 1.0 and m.row_exact_match == 1.0


def test_empty_prediction() -> None:
    m = aligned_table_metrics([], GOLD, ["name", "points"])
    assert m.cell_f1 == 0.0 and m.aligned_cell_accuracy == 0.0 and m.column_header_f1 == 0.0


def test_null_cells_are_ignored() -> None:
    m = aligned_table_metrics([{"a": "1"}], [{"a": "1", "b": None}], ["a", "b"])
    assert m.cell_f1 == 1.0 and m.row_exact_match == 1.0


def test_as_dict_is_every_field_in_order_with_its_value() -> None:
    import dataclasses

    m = aligned_table_metrics([{"a": "1", "b": "x"}], [{"a": "1", "b": "y"}, {"a": "2", "b": "z"}], ["a", "b"])
    d = m.as_dict()
    assert d == dataclasses.asdict(m)
    assert list(d) == [f.name for f in dataclasses.fields(m)]
    assert 0.0 < d["cell_recall"] < 1.0


def test_rows_past_the_alignment_cap_pair_identical_rows_first() -> None:
    import random

    gold = [{"a": str(i)} for i in range(40)]
    shuffled = gold[:]
    random.Random(0).shuffle(shuffled)
    full = aligned_table_metrics(shuffled, gold, ["a"], max_align_rows=1000)
    capped = aligned_table_metrics(shuffled, gold, ["a"], max_align_rows=8)
    assert full.cell_f1 == 1.0 and capped.cell_f1 == 1.0  # every row is correct: order costs nothing
    wrong = [{"a": "x"}] * 40
    assert aligned_table_metrics(wrong, gold, ["a"], max_align_rows=8).cell_f1 == 0.0
    with pytest.raises(ValueError, match="max_rows"):
        aligned_table_metrics(shuffled, gold, ["a"], max_align_rows=0)

import json

import pytest

from shared import cell_accuracy, gold_table_to_rows, normalize_cell, parse_ndjson, parse_ndjson_detailed

GOLD = {"columns": [{"name": "name"}, {"name": "points"}], "data": [["Wall", "9"], ["Beal", "20"]]}


def test_gold_table_to_rows_keeps_order() -> None:
    rows = gold_table_to_rows(GOLD)
    assert rows == [{"name": "Wall", "points": "9"}, {"name": "Beal", "points": "20"}]
    assert list(rows[0]) == ["name", "points"]


def test_gold_table_to_rows_string_columns_and_ragged_rows() -> None:
    assert gold_table_to_rows({"columns": ["a"], "data": [["x"]]}) == [{"a": "x"}]
    with pytest.raises(ValueError):
        gold_table_to_rows({"columns": ["a", "b"], "data": [["x"]]})


def test_parse_ndjson() -> None:
    assert parse_ndjson('{"a": 1}\n\n  \n{"a": 2}\n') == [{"a": 1}, {"a": 2}]
    assert parse_ndjson("") == []
    assert parse_ndjson('{"a": 1}\n[1]') is None
    assert parse_ndjson('{"a": 1}\nnot json') is None
    assert parse_ndjson('```\n{"a": 1}\n```') is None
    assert parse_ndjson('"str"') is None
    d = parse_ndjson_detailed('{"a": 1}\n{"a": ')
    assert not d.valid and d.error is not None and d.error.startswith("line 2")


def test_parse_ndjson_deep_and_huge() -> None:
    assert parse_ndjson("[" * 100_000 + "]" * 100_000) is None
    big = "\n".join(json.dumps({"k": i, "v": "x" * 100}) for i in range(20_000))
    rows = parse_ndjson(big)
    assert rows is not None and len(rows) == 20_000


def test_perfect_and_empty() -> None:
    assert cell_accuracy(gold_table_to_rows(GOLD), gold_table_to_rows(GOLD)) == 1.0
    assert cell_accuracy([], []) == 1.0


def test_positional_hand_computed() -> None:
    pred = [{"name": "Wall", "points": "9"}, {"name": "Beal", "points": "21"}]
    assert cell_accuracy(pred, gold_table_to_rows(GOLD)) == 0.75


def test_swapped_rows_score_zero_positionally() -> None:
    pred = [{"name": "Beal", "points": "20"}, {"name": "Wall", "points": "9"}]
    assert cell_accuracy(pred, gold_table_to_rows(GOLD)) == 0.0


def test_missing_row_counts_its_cells() -> None:
    # row 2 missing: its 2 gold keys vs {} → 2 wrong of 4
    assert cell_accuracy([{"name": "Wall", "points": "9"}], gold_table_to_rows(GOLD)) == 0.5


def test_extra_row_and_extra_key() -> None:
    gold = [{"a": "1"}]
    # row 1: keys {a, b}: a right, b wrong (""≠"x"); row 2: {a}: wrong → 1/3
    assert cell_accuracy([{"a": "1", "b": "x"}, {"a": "2"}], gold) == pytest.approx(1 / 3)


def test_missing_key_matches_null_gold() -> None:
    assert cell_accuracy([{"a": "1"}], [{"a": "1", "b": None}]) == 1.0
    assert cell_accuracy([{"a": "1", "b": ""}], [{"a": "1", "b": None}]) == 1.0
    assert cell_accuracy([{"a": "1", "b": None}], [{"a": "1", "b": "x"}]) == 0.5


def test_numbers_vs_strings_and_strip() -> None:
    assert cell_accuracy([{"p": 9, "q": " yes "}], [{"p": "9", "q": "yes"}]) == 1.0
    assert cell_accuracy([{"p": 9.0}], [{"p": "9"}]) == 0.0  # str(9.0) == "9.0"
    assert cell_accuracy([{"p": True}], [{"p": "true"}]) == 1.0  # JSON's spelling, not Python's
    assert cell_accuracy([{"p": False}], [{"p": "False"}]) == 0.0


def test_json_number_literals_are_kept() -> None:
    rows = parse_ndjson('{"p": 1.50, "q": 2e3, "r": -0.0, "s": 10}')
    assert rows is not None
    assert [normalize_cell(v) for v in rows[0].values()] == ["1.50", "2e3", "-0.0", "10"]
    assert rows[0]["p"] == 1.5 and isinstance(rows[0]["p"], float)
    assert cell_accuracy(rows, [{"p": "1.50", "q": "2e3", "r": "-0.0", "s": "10"}]) == 1.0


def test_keys_compare_raw() -> None:
    assert cell_accuracy([{"Name": "Wall"}], [{"name": "Wall"}]) == 0.0


def test_unicode_cells() -> None:
    assert cell_accuracy([{"v": "café ☕"}], [{"v": " café ☕"}]) == 1.0


def test_rows_without_keys() -> None:
    assert cell_accuracy([{}], []) == 1.0
    assert cell_accuracy([{}], [{"a": "x"}]) == 0.0


def test_unicode_line_separators_inside_strings() -> None:
    # U+0085 and U+2028 are line breaks for str.splitlines but legal raw characters in JSON strings
    text = '{"v": "a\u0085b"}\r\n{"v": "c\u2028d"}'
    assert parse_ndjson(text) == [{"v": "a\u0085b"}, {"v": "c\u2028d"}]

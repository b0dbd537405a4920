import json

import pytest

from shared import parse_schema_text, schema_prf_from_text, strip_code_fence

GOLD = {"table_id": "t", "columns": [{"name": "name"}, {"name": "price_range"}, {"name": "area"}, {"name": "food"}]}


def test_perfect_columns_shape() -> None:
    m = schema_prf_from_text(
        json.dumps({"columns": [{"name": n} for n in ["name", "price_range", "area", "food"]]}), GOLD
    )
    assert (m.precision, m.recall, m.f1, m.valid_json) == (1.0, 1.0, 1.0, True)


@pytest.mark.parametrize(
    "text",
    [
        '{"fields": [{"name": "name"}, {"name": "priceRange"}, {"name": "Area"}, {"name": "food"}]}',
        '["name", "price range", "AREA", "food"]',
        '[{"name": "name", "type": "string"}, "PriceRange", "area", "food"]',
        '```json\n{"columns": ["name", "price_range", "area", "food"]}\n```',
        '  ```\n["name","price_range","area","food"]\n```  ',
    ],
)
def test_accepted_shapes_and_normalisation(text: str) -> None:
    m = schema_prf_from_text(text, GOLD)
    assert m.valid_json and m.f1 == 1.0


def test_partial_hand_computed() -> None:
    # pred {name, area, rating}; gold {name, price_range, area, food}: tp=2, P=2/3, R=2/4, F1=4/7
    m = schema_prf_from_text('["name", "area", "rating"]', GOLD)
    assert m.precision == pytest.approx(2 / 3)
    assert m.recall == pytest.approx(0.5)
    assert m.f1 == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))


def test_duplicates_are_a_set() -> None:
    # "name", "Name" and "NAME" are one column after normalisation: P = 1/1, R = 1/4
    m = schema_prf_from_text('["name", "Name", "NAME"]', GOLD)
    assert (m.precision, m.recall) == (1.0, 0.25)
    assert m.f1 == pytest.approx(0.4)


def test_no_overlap_is_zero() -> None:
    m = schema_prf_from_text('["x", "y"]', GOLD)
    assert (m.precision, m.recall, m.f1, m.valid_json) == (0.0, 0.0, 0.0, True)


def test_empty_prediction_is_valid_but_scores_zero() -> None:
    m = schema_prf_from_text('{"columns": []}', GOLD)
    assert m.valid_json and m.f1 == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"cols": ["a"]}',
        '{"columns": "name"}',
        "[1, 2]",
        '[{"label": "x"}]',
        '"name"',
        '```json\n{"columns": ["a"]}\n```\n```json\n{}\n```',  # two fences: only one is allowed
        "[" * 100_000 + "]" * 100_000,  # deeply nested
    ],
)
def test_invalid(text: str) -> None:
    m = schema_prf_from_text(text, GOLD)
    assert not m.valid_json and m.f1 == 0.0 and m.error


def test_fence_strip_only_one() -> None:
    assert strip_code_fence("```json\n[1]\n```") == "[1]"
    assert strip_code_fence("  [1]  ") == "[1]"
    assert strip_code_fence("```\n```") == ""


def test_unicode_names() -> None:
    gold = {"columns": [{"name": "prénom"}, {"name": "âge"}]}
    assert schema_prf_from_text('["Prénom", "Âge"]', gold).f1 == 1.0


def test_huge_schema() -> None:
    names = [f"col_{i}" for i in range(5000)]
    gold = {"columns": [{"name": n} for n in names]}
    m = schema_prf_from_text(json.dumps(names[:2500]), gold)
    assert m.precision == 1.0 and m.recall == 0.5


def test_parse_keeps_order() -> None:
    assert parse_schema_text('{"columns": ["b", {"name": "a"}]}').names == ("b", "a")

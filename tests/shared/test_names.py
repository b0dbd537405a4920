import pytest

from shared import normalize_name


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("priceRange", "price_range"),
        ("Price Range", "price_range"),
        ("price-range", "price_range"),
        ("  price__range  ", "price_range"),
        ("HTTPResponseCode", "http_response_code"),
        ("field_goals_made", "field_goals_made"),
        ("eatType", "eat_type"),
        ("rebounds3", "rebounds3"),
        ("3PointMade", "3_point_made"),
        ("Prénom", "prénom"),
        ("---", ""),
        ("customer rating (1-5)", "customer_rating_1_5"),
    ],
)
def test_normalize_name(raw: str, expected: str) -> None:
    assert normalize_name(raw) == expected


def test_normalize_is_idempotent() -> None:
    for raw in ["priceRange", "HTTPResponseCode", "a  B-c", "Prénom"]:
        once = normalize_name(raw)
        assert normalize_name(once) == once

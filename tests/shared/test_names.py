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


def test_the_cache_is_bounded_and_changes_no_answer() -> None:
    from shared.names import NAME_CACHE_SIZE

    info = normalize_name.cache_info()
    assert info.maxsize == NAME_CACHE_SIZE
    names = ["priceRange", "Price Range", "HTTPServer", "Prénom", "__x__", "", "a--b", "ÉtéName", "x1Y2"]
    for name in names * 3:
        assert normalize_name(name) == normalize_name.__wrapped__(name)
    assert normalize_name.cache_info().hits >= info.hits + 2 * len(names)

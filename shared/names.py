"""Column-name normalisation shared by every schema comparison (docs/rewards.md).

camelCase → snake_case, lower case, runs of non-alphanumerics → ``_``, outer ``_`` stripped.
Letters and digits of any script count as alphanumeric, so ``"Prénom"`` stays ``"prénom"``.
"""

from __future__ import annotations

import re
from functools import lru_cache

_ACRONYM_BOUNDARY = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")
_NON_ALNUM_RUN = re.compile(r"[\W_]+")


# Every schema and table comparison normalises the same few hundred column names again and again (three
# regex passes each: about half of a schema reward's time at batch 1024). Bounded: model output can
# invent any number of names.
NAME_CACHE_SIZE = 1 << 14


@lru_cache(maxsize=NAME_CACHE_SIZE)
def normalize_name(name: str) -> str:
    """Normalise a column name: ``"priceRange"`` and ``"Price Range"`` both give ``"price_range"``."""
    s = _ACRONYM_BOUNDARY.sub(r"\1_\2", name)
    s = _CAMEL_BOUNDARY.sub(r"\1_\2", s)
    return _NON_ALNUM_RUN.sub("_", s.lower()).strip("_")

"""The C2 precompute's sample of the train split (pure parts; the vLLM path is in test_inference_vllm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.inference import precompute_c2, seeded_sample


def test_seeded_sample_is_reproducible_ordered_and_whole_when_short() -> None:
    items = list(range(100))
    a, b = seeded_sample(items, 10, seed=3), seeded_sample(items, 10, seed=3)
    assert a == b and len(a) == 10 and len(set(a)) == 10
    assert a == sorted(a)  # file order is kept
    assert seeded_sample(items, 10, seed=4) != a  # the seed decides which
    assert seeded_sample(items, 100, seed=3) == items and seeded_sample(items, 500, seed=3) == items


@pytest.mark.parametrize(
    ("sample", "message"),
    [({"test": 5}, r"sample: splits \['test'\] are not among \['train', 'validation'\]"), ({"train": 0}, ">= 1")],
)
def test_precompute_names_a_bad_sample_before_calling_the_executor(
    tmp_path: Path, sample: dict[str, int], message: str
) -> None:
    no_client = cast(Any, None)  # never reached: the arguments are checked first
    with pytest.raises(ValueError, match=message):
        precompute_c2(SAMPLE_DIR, tmp_path, no_client, sample=sample)
    assert not (tmp_path / "c2").exists()

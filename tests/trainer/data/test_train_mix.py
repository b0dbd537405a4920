"""--rl-mix-share: a chosen train set kept whole, the other sources' prompts added evenly to make the share,
seeded, recorded in the file and refused on reuse with another share (trainer/data/train_mix.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shared.golden import source_of
from tests.trainer.runs.test_loop import SAMPLE
from trainer.data.train_mix import (
    MIX_SEED,
    TrainMixError,
    build_mix,
    check_restricted,
    check_reuse,
    check_share,
    even_quota,
    mixed_set_path,
    recorded_mix,
    write_mixed_set,
)
from trainer.data.train_set import source_prompt_set


@pytest.fixture
def sets(tmp_path: Path) -> tuple[Path, Path]:
    """B2's train split of the sample (4 prompts of each of invoice, people, product) and its people set."""
    from trainer.data.datasets import build_datasets

    build_datasets(SAMPLE, tmp_path / "data", ["b2"])
    train = tmp_path / "data" / "b2" / "train.parquet"
    chosen = tmp_path / "train_sets" / "b2_people.parquet"
    source_prompt_set(train, ("people",), chosen)
    return chosen, train


def ids(path: Path) -> list[str]:
    return [r["id"] for r in pq.read_table(path).column("extra_info").to_pylist()]


def test_the_chosen_set_is_kept_and_the_others_make_the_share_evenly(sets: tuple[Path, Path]) -> None:
    chosen, train = sets
    out = mixed_set_path(chosen.parent, chosen)
    assert out.name == "b2_people+mix.parquet"
    record = write_mixed_set(chosen, train, 0.5, out)
    got = ids(out)
    assert got[:4] == ids(chosen)  # kept whole, first
    assert Counter(source_of(i) for i in got) == {"people": 4, "invoice": 2, "product": 2}
    assert len(set(got)) == len(got)  # without replacement
    assert record["share"] == 0.5 and record["seed"] == MIX_SEED and record["total"] == 8
    assert record["drawn"] == {"invoice": 2, "product": 2}
    assert record["prompts"] == {"people": 4, "invoice": 2, "product": 2}
    assert record["chosen"]["path"] == str(chosen) and record["chosen"]["prompts"] == {"people": 4}
    assert recorded_mix(out) == {k: v for k, v in record.items() if k != "path"}  # in the file's metadata
    assert pq.read_schema(out).remove_metadata() == pq.read_schema(chosen).remove_metadata()


def test_the_draw_is_seeded(sets: tuple[Path, Path]) -> None:
    chosen, train = sets
    first, again = build_mix(chosen, train, 0.5), build_mix(chosen, train, 0.5)
    assert first[0].equals(again[0]) and first[1] == again[1]
    seeds = {tuple(r["id"] for r in build_mix(chosen, train, 0.5, seed=s)[0].column("extra_info").to_pylist())
             for s in range(8)}  # fmt: skip
    assert len(seeds) > 1  # the seed picks the prompts


def test_even_quota_fills_from_the_larger_sources_where_one_is_short() -> None:
    assert even_quota(6, {"e2e": 10, "rotowire_sent": 100}) == {"e2e": 3, "rotowire_sent": 3}
    assert even_quota(6, {"e2e": 1, "rotowire_sent": 100}) == {"e2e": 1, "rotowire_sent": 5}
    assert even_quota(1, {"e2e": 5, "rotowire_sent": 5}) == {"e2e": 1, "rotowire_sent": 0}


def test_share_zero_adds_nothing(sets: tuple[Path, Path]) -> None:
    chosen, train = sets
    table, record = build_mix(chosen, train, 0.0)
    assert table.equals(pq.read_table(chosen)) and record["drawn"] == {}


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5])
def test_a_share_out_of_range_is_named(share: float) -> None:
    with pytest.raises(TrainMixError, match=r"--rl-mix-share: .*at least 0 and below 1"):
        check_share(share)


def test_no_other_source_or_too_few_prompts_are_named(sets: tuple[Path, Path], tmp_path: Path) -> None:
    chosen, train = sets
    with pytest.raises(TrainMixError, match=r"--rl-mix-share: 0.2: needs --rl-sources; .*no other source"):
        check_restricted(0.2, False, "--rl-sources")
    check_restricted(0.0, False, "--rl-sources")
    with pytest.raises(TrainMixError, match=r"already has every source .*no other source to draw from"):
        build_mix(train, train, 0.2)
    # 4 chosen prompts at 0.75 need 12 from invoice and product, which have 8
    with pytest.raises(TrainMixError, match=r"4 chosen prompts need 12 from \['invoice', 'product'\], which have 8"):
        build_mix(chosen, train, 0.75)


def test_a_set_built_with_another_share_is_refused_naming_both(sets: tuple[Path, Path]) -> None:
    chosen, train = sets
    out = mixed_set_path(chosen.parent, chosen)
    assert check_reuse(out, chosen, 0.5) is None  # nothing built yet
    write_mixed_set(chosen, train, 0.5, out)
    assert check_reuse(out, chosen, 0.5) == recorded_mix(out) | {"path": str(out)}
    with pytest.raises(TrainMixError, match=r"share: built with 0.5, asked for 0.2.*remove it"):
        check_reuse(out, chosen, 0.2)
    with pytest.raises(TrainMixError, match=r"share: built with 0.5, asked for 0.0"):
        check_reuse(out, chosen, 0.0)  # a rerun without the option does not reuse the mix either
    with pytest.raises(TrainMixError, match=r"seed: built with 0, asked for 3"):
        check_reuse(out, chosen, 0.5, seed=3)
    source_prompt_set(train, ("people", "invoice"), chosen)  # the chosen set changed under the same name
    with pytest.raises(TrainMixError, match=r"changed since"):
        check_reuse(out, chosen, 0.5)

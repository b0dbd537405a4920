"""The SFT source mix: copies and seeded shares per source, validation untouched, clear errors, the manifest."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared import golden_filename, read_golden
from shared.golden import source_of
from trainer.cli import app
from trainer.data.datasets import build_datasets, read_rows
from trainer.data.sample_data import SAMPLE_DIR
from trainer.data.sft_mix import SourceMix, SourceMixError

TRAIN = read_golden(SAMPLE_DIR / golden_filename("train"))  # 4 invoice, 4 people, 4 product


def per_source(examples: list) -> Counter[str]:
    return Counter(source_of(ex.id) for ex in examples)


def test_parse_reads_weights_and_names_the_bad_part() -> None:
    assert SourceMix.parse("people=2, product=0.5").weights == {"people": 2.0, "product": 0.5}
    for text, says in (
        ("people", "expected SOURCE=WEIGHT"),
        ("people=two", "people='two': the weight is not a number"),
        ("people=-1", "people=-1.0: a weight is a finite number >= 0"),
        ("people=nan", "a weight is a finite number >= 0"),
        ("people=1,people=2", "people is named twice"),
        (" , ", "names no source"),
    ):
        with pytest.raises(SourceMixError, match=says):
            SourceMix.parse(text)


def test_copies_and_a_seeded_share_per_source_in_file_order() -> None:
    mixed = SourceMix.parse("people=2,product=0.5,invoice=0", seed=3).apply(TRAIN)
    assert per_source(mixed) == {"people": 8, "product": 2}  # invoice dropped, unnamed sources would keep 1
    people = [ex.id for ex in TRAIN if source_of(ex.id) == "people"]
    assert [ex.id for ex in mixed if source_of(ex.id) == "people"] == people * 2
    share = [ex.id for ex in mixed if source_of(ex.id) == "product"]
    products = [ex.id for ex in TRAIN if source_of(ex.id) == "product"]
    assert set(share) < set(products) and share == sorted(share, key=products.index)
    # the same seed gives the same share; the share over seeds is not always the same two
    assert [ex.id for ex in SourceMix.parse("product=0.5", seed=3).apply(TRAIN) if ex.id in products] == share
    shares = {tuple(ex.id for ex in SourceMix.parse("product=0.5", seed=s).apply(TRAIN) if ex.id in products)
              for s in range(8)}  # fmt: skip
    assert len(shares) > 1
    assert per_source(SourceMix.parse("people=1.5").apply(TRAIN)) == {"invoice": 4, "people": 6, "product": 4}


def test_a_mix_that_names_an_absent_source_or_leaves_nothing_fails() -> None:
    with pytest.raises(SourceMixError, match=r"no train example of \['wikitabletext'\]; the sources are"):
        SourceMix.parse("wikitabletext=2").apply(TRAIN)
    with pytest.raises(SourceMixError, match="leaves no train example"):
        SourceMix.parse("people=0,product=0,invoice=0").apply(TRAIN)


def test_build_mixes_only_the_sft_train_split_and_records_it(tmp_path: Path) -> None:
    counts = build_datasets(SAMPLE_DIR, tmp_path, ["a1", "a2", "b1"], sft_mix=SourceMix.parse("people=3,product=0"))
    assert counts["a1"] == counts["a2"] == {"train": 16, "validation": 6}
    assert counts["b1"]["train"] == 12  # RL prompts are not mixed
    rows = read_rows(tmp_path / "a1" / "train.parquet")
    people_texts = [ex.text for ex in TRAIN if source_of(ex.id) == "people"]
    users = [r["messages"][1]["content"] for r in rows]
    assert sum(any(t in u for t in people_texts) for u in users) == 12
    manifest = json.loads((tmp_path / "manifest.json").read_text())["phases"]
    for phase in ("a1", "a2"):
        mix = manifest[phase]["sft_mix"]
        assert mix["weights"] == {"people": 3.0, "product": 0.0} and mix["seed"] == 0
        assert mix["train_before"] == {"invoice": 4, "people": 4, "product": 4}
        assert mix["train_after"] == {"invoice": 4, "people": 12}
    assert "sft_mix" not in manifest["b1"]


def test_cli_names_the_option_on_a_bad_mix(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["data", "build", "--golden", str(SAMPLE_DIR), "--out", str(tmp_path), "--sft-mix", "e2e=2"]
    )
    assert res.exit_code == 2
    assert "--sft-mix" in res.output and "no train example of ['e2e']" in res.output
    ok = CliRunner().invoke(
        app, ["data", "build", "--golden", str(SAMPLE_DIR), "--out", str(tmp_path), "--phases", "a1", "--sft-mix",
              "people=2"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "SFT mix people=2" in ok.output
    assert json.loads((tmp_path / "manifest.json").read_text())["phases"]["a1"]["counts"]["train"] == 16


def test_built_data_is_reused_only_with_the_mix_it_was_built_with(tmp_path: Path) -> None:
    from trainer.data.sft_mix import check_reuse, recorded_mix

    mix = SourceMix.parse("people=2", seed=1)
    build_datasets(SAMPLE_DIR, tmp_path / "mixed", ["a1", "a2"], sft_mix=mix)
    build_datasets(SAMPLE_DIR, tmp_path / "plain", ["a1", "a2"])
    assert recorded_mix(tmp_path / "mixed")["weights"] == {"people": 2.0} and recorded_mix(tmp_path / "plain") is None
    check_reuse(tmp_path / "mixed", SourceMix.parse("people=2", seed=1))
    check_reuse(tmp_path / "plain", None)
    with pytest.raises(SourceMixError, match=r"built with people=2 \(seed 1\), asked for no mix"):
        check_reuse(tmp_path / "mixed", None)
    with pytest.raises(SourceMixError, match=r"built with people=2 \(seed 1\), asked for people=2 \(seed 0\)"):
        check_reuse(tmp_path / "mixed", SourceMix.parse("people=2"))
    with pytest.raises(SourceMixError, match=r"built with no mix, asked for product=0.5 \(seed 0\)"):
        check_reuse(tmp_path / "plain", SourceMix.parse("product=0.5"))


@pytest.mark.parametrize("command", [["loop"], ["experiment", "pi1-ab"]])
def test_the_loop_and_the_experiments_take_a_mix(command: list[str]) -> None:
    res = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--sft-mix" in res.output

"""A prompt set that cannot fill one GRPO batch fails before VERL starts, naming the settings."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.data.train_set import TrainSetTooSmall, check_fills_a_batch, count_prompts


def _parquet(path: Path, rows: int) -> str:
    pq.write_table(pa.table({"prompt": [f"p{i}" for i in range(rows)]}), path)
    return str(path)


def test_a_set_smaller_than_the_batch_is_refused_by_name(tmp_path: Path) -> None:
    f = _parquet(tmp_path / "b2_improvable.parquet", 49)  # 49 improvable prompts against a batch of 64
    with pytest.raises(TrainSetTooSmall, match=r"gives 49 prompts, fewer than data.train_batch_size 64"):
        check_fills_a_batch(f, 64, 2048)


def test_train_max_samples_caps_what_counts(tmp_path: Path) -> None:
    f = _parquet(tmp_path / "train.parquet", 100)
    assert check_fills_a_batch(f, 64, None) == 100
    assert check_fills_a_batch(f, 64, -1) == 100  # VERL: -1 is "all"
    with pytest.raises(TrainSetTooSmall, match=r"data.train_max_samples 32"):
        check_fills_a_batch(f, 64, 32)


def test_several_files_add_up_and_a_missing_one_is_named(tmp_path: Path) -> None:
    files = [_parquet(tmp_path / "a.parquet", 40), _parquet(tmp_path / "b.parquet", 30)]
    assert count_prompts(files) == 70 and check_fills_a_batch(files, 64, None) == 70
    with pytest.raises(TrainSetTooSmall, match=r"nope\.parquet does not exist"):
        count_prompts([*files, str(tmp_path / "nope.parquet")])


@pytest.mark.verl
def test_trainer_run_stops_before_ray_with_the_reason(tmp_path: Path) -> None:
    """Through the real entry point (VERL's Hydra config, our verl_main): exit in seconds, with the reason in
    train.log, where VERL 0.9.1 raised ZeroDivisionError in fit() after its start-up."""
    import subprocess
    import sys

    small = _parquet(tmp_path / "small.parquet", 3)
    out = tmp_path / "b2"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "b2", "--profile", "cpu-smoke", "--data", str(tmp_path),
         "--out", str(out), "--reward-url", "http://127.0.0.1:9", f"data.train_files={small}",
         "data.train_batch_size=4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    log = (out / "train.log").read_text()
    assert "gives 3 prompts, fewer than data.train_batch_size 4" in log, log[-2000:]
    assert "Started a local Ray instance" not in log  # refused before Ray, not after VERL's start-up


def test_a_source_set_keeps_those_sources_rows_whole(tmp_path: Path) -> None:
    """--rl-sources: the rows of a real `data build` RL parquet of the sources asked for, in the same
    Arrow schema (VERL reads it as the train split); a source with no prompt there is named."""
    from shared.golden import source_of
    from tests.trainer.runs.test_loop import SAMPLE
    from trainer.data.datasets import build_datasets
    from trainer.data.train_set import source_prompt_set

    build_datasets(SAMPLE, tmp_path / "data", ["b2"])
    train = tmp_path / "data" / "b2" / "train.parquet"
    out = tmp_path / "sets" / "b2_people+invoice.parquet"
    assert source_prompt_set(train, ("people", "invoice"), out) == 8
    whole, kept = pq.read_table(train), pq.read_table(out)
    assert kept.schema == whole.schema
    ids = [r["id"] for r in kept.column("extra_info").to_pylist()]
    assert {source_of(i) for i in ids} == {"people", "invoice"}
    assert kept.to_pylist() == [r for r in whole.to_pylist() if source_of(r["extra_info"]["id"]) != "product"]
    named = r"no prompt of source\(s\) \['wikitabletext'\] \(it has \['invoice', 'people', 'product'\]\)"
    with pytest.raises(ValueError, match=named):
        source_prompt_set(train, ("people", "wikitabletext"), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="no extra_info column"):
        source_prompt_set(Path(_parquet(tmp_path / "bare.parquet", 3)), ("people",), tmp_path / "y.parquet")


def test_the_profiles_read_here_are_the_launchers() -> None:
    from trainer.data.train_set import PROFILE_DIR
    from trainer.phases.launch import CONFIG_DIR

    assert PROFILE_DIR == CONFIG_DIR / "profile" and (PROFILE_DIR / "gpu.yaml").is_file()

"""The SFT length filter runs before torchrun, counts as VERL's MultiTurnSFTDataset counts, drops the
conversations over data.max_length by id and stops a phase that has none that fits
(trainer/data/sft_length_filter.py, trainer/phases/launch.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.trainer.data.test_length_report import HUGE_DOC, WIDE, huge_golden, model_dir  # noqa: F401 (a fixture)
from tests.trainer.phases.test_launch import composed, env  # noqa: F401  (env is a fixture)
from trainer.data import sft_length_filter as sf
from trainer.data.datasets import build_datasets
from trainer.data.prompt_filter import read_record
from trainer.data.sample_data import SAMPLE_DIR
from trainer.phases import launch
from trainer.phases.launch import CONFIG_DIR, PhaseRun, read_result
from trainer.registry.phases import get_phase


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A1's and A2's parquet of the sample with a 1 MB document and a 10,000-column schema in train."""
    root = tmp_path_factory.mktemp("sft")
    out = root / "data"
    build_datasets(huge_golden(root / "golden"), out, phases=("a1", "a2"))
    return out


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _overrides(data: Path, model: Path, tmp_path: Path, phase: str = "a1") -> list[str]:
    return [
        "sft_profile=gpu",
        f"data.train_files={data}/{phase}/train.parquet",
        f"data.val_files={data}/{phase}/validation.parquet",
        f"model.path={model}",
        f"trainer.default_local_dir={tmp_path / 'out' / 'checkpoints'}",
    ]


def test_a_conversation_counts_as_its_whole_rendering(model_dir: Path) -> None:  # noqa: F811
    """VERL's dataset checks that its per-message pieces add up to the whole conversation's rendering."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = build_rows()
    got = sf.count_conversation_lengths(rows, tok, {})
    for conv, n in zip(rows, got, strict=True):
        whole = tok.apply_chat_template(conv, add_generation_prompt=False, tokenize=False)
        assert n == len(tok(whole, add_special_tokens=False)["input_ids"]) > 50


def build_rows() -> list[Any]:
    from shared import golden_filename, read_golden
    from trainer.data.datasets import sft_row

    examples = read_golden(SAMPLE_DIR / golden_filename("validation"))
    return [sft_row(p, ex)["messages"] for p in ("a1", "a2") for ex in examples]


@pytest.mark.verl
def test_lengths_are_those_of_verls_sft_dataset(model_dir: Path, data: Path, tmp_path: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    tok = AutoTokenizer.from_pretrained(model_dir)
    for phase in ("a1", "a2"):
        path = data / phase / "validation.parquet"
        cfg = {"max_length": 100_000, "pad_mode": "no_padding", "truncation": "error", "messages_key": "messages"}
        ds = MultiTurnSFTDataset(parquet_files=[str(path)], tokenizer=tok, config=cfg)
        verl = [len(ds[i]["input_ids"]) for i in range(len(ds))]
        msgs = pq.read_table(path, columns=["messages"]).column("messages").to_pylist()
        assert sf.count_conversation_lengths(msgs, tok, {}) == verl


def test_too_long_conversations_are_dropped_by_id_into_new_files(
    env: None,  # noqa: F811
    model_dir: Path,  # noqa: F811
    data: Path,
    tmp_path: Path,
    cache: Path,
) -> None:
    c = composed("a1_sft", *_overrides(data, model_dir, tmp_path))
    assert c.sft_length_filter.enabled is True and c.data.max_length == 1024
    results = sf.apply(c, tmp_path / "sft_data")
    assert results is not None and [r.split for r in results] == ["train", "val"]
    train, val = results
    assert train.dropped == 2 and train.dropped_ids == [HUGE_DOC, WIDE] and train.rows == 12
    assert train.limit == 1024 and train.limit_key == "data.max_length" and train.longest > 200_000
    assert val.dropped == 0 and c.data.val_files == f"{data}/a1/validation.parquet"
    kept = pq.read_table(c.data.train_files)
    assert c.data.train_files == str(tmp_path / "sft_data" / "train_0_train.parquet") and kept.num_rows == 10
    assert HUGE_DOC not in kept.column("id").to_pylist()
    line = train.describe()
    assert line.startswith("[sft_length_filter] train: 12 conversations") and "limit data.max_length 1024" in line
    assert f"2 dropped as too long ({HUGE_DOC}, {WIDE})" in line
    assert sf.file_overrides(results) == (f"data.train_files={c.data.train_files}",)
    # a second start reads every length from the cache
    again = sf.apply(composed("a1_sft", *_overrides(data, model_dir, tmp_path)), tmp_path / "sft_data")
    assert again is not None and again[0].from_cache == 12 and again[0].dropped_ids == [HUGE_DOC, WIDE]
    assert (cache / "sft_lengths").is_dir()


def test_all_too_long_is_an_error_naming_the_field_and_the_limit(
    env: None,  # noqa: F811
    model_dir: Path,  # noqa: F811
    data: Path,
    tmp_path: Path,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--config-path", str(CONFIG_DIR), "--config-name", "a2_sft", *_overrides(data, model_dir, tmp_path, "a2")]
    assert sf.main([*args, "data.max_length=5"]) == 2
    want = "data.train_files: all 12 conversations are longer than data.max_length 5 tokens"
    assert want in capsys.readouterr().err
    found = read_record(tmp_path / "out" / "checkpoints" / sf.RECORD_FILE)
    assert found is not None and found[1] is not None and want in found[1]
    # off: nothing counted, VERL's own check stays
    off = composed("a2_sft", *_overrides(data, model_dir, tmp_path, "a2"), "sft_length_filter.enabled=false")
    assert sf.apply(off, tmp_path / "sft_data") is None
    cut = composed("a2_sft", *_overrides(data, model_dir, tmp_path, "a2"), "data.truncation=right")
    assert sf.apply(cut, tmp_path / "sft_data") is None  # VERL cuts the long ones: nothing to drop


def _sft_run(data: Path, model: Path, out: Path, *overrides: str) -> PhaseRun:
    return PhaseRun(get_phase("a1"), "gpu", data, out, str(model), overrides=overrides)


@pytest.mark.slow  # a child process composes the phase's config (Hydra imports VERL's config package)
def test_the_launcher_runs_the_filter_first_and_records_it(
    model_dir: Path,  # noqa: F811
    data: Path,
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched: list[PhaseRun] = []
    monkeypatch.setattr(launch, "launch", lambda run, **_: launched.append(run) or 0)
    # a batch the 10 rows left can fill on the profile's 8 ranks: its epoch plan counts them (1 step an epoch)
    res = launch.run_phase(_sft_run(data, model_dir, tmp_path / "o", "data.train_batch_size=8"), export=False)
    assert res.status == "ok" and len(launched) == 1, res.error
    assert f"data.train_files={tmp_path / 'o' / 'sft_data' / 'train_0_train.parquet'}" in launched[0].overrides
    assert {"trainer.test_freq=1", "trainer.save_freq=1"} <= set(launched[0].overrides)
    assert res.command == launched[0].command()
    on_disk = read_result(tmp_path / "o")
    assert on_disk is not None and on_disk.length_filter is not None
    train = on_disk.length_filter[0]
    assert (train["split"], train["rows"], train["dropped"]) == ("train", 12, 2)
    assert (train["limit_key"], train["limit"], train["first_dropped_ids"]) == (
        "data.max_length",
        1024,
        [HUGE_DOC, WIDE],
    )
    log = (tmp_path / "o" / "train.log").read_text()
    assert "[sft_length_filter] train: 12 conversations" in log and f"2 dropped as too long ({HUGE_DOC}, {WIDE})" in log


@pytest.mark.slow
def test_a_phase_with_no_conversation_that_fits_fails_before_verl(
    model_dir: Path,  # noqa: F811
    data: Path,
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "launch", lambda run, **_: pytest.fail("VERL started"))
    res = launch.run_phase(_sft_run(data, model_dir, tmp_path / "o", "data.max_length=5"), export=False)
    want = "data.train_files: all 12 conversations are longer than data.max_length 5 tokens"
    assert res.status == "failed" and res.exit_code == 2 and res.error is not None and want in res.error
    on_disk = json.loads((tmp_path / "o" / "phase_result.json").read_text())
    assert want in on_disk["error"] and want in (tmp_path / "o" / "train.log").read_text()

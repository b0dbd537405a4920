"""The prompt length filter runs once, before Ray, and counts as VERL counts (trainer/data/prompt_filter.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.trainer.phases.test_gpu_profile import composed_command, gpu_run
from tests.trainer.phases.test_launch import env  # noqa: F401  (a fixture)
from trainer.data import prompt_filter as pf
from trainer.data.datasets import build_datasets

SAMPLE = Path(__file__).resolve().parents[3] / "trainer" / "data" / "e2e_sample"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from services.executor_vllm.default_model import default_model_dir

    path = default_model_dir()
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"the default model is not converted at {path} (make model)")
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    out = tmp_path / "data"
    build_datasets(SAMPLE, out, phases=("b1", "b2"))
    return out


def _config(data: Path, model: Path, tmp_path: Path, *overrides: str) -> Any:
    files = [f"data.train_files={data}/b1/train.parquet", f"data.val_files={data}/b1/validation.parquet"]
    cache = f"+prompt_filter.cache_dir={tmp_path / 'cache'}"
    return composed_command(gpu_run("b1", f"actor_rollout_ref.model.path={model}", *files, cache, *overrides))


def test_lengths_are_verls(model_dir: Path, data: Path) -> None:
    """VERL's filter: ``len(apply_chat_template(messages, add_generation_prompt=True, tokenize=True))``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for phase in ("b1", "b2"):
        msgs = pq.read_table(data / phase / "train.parquet", columns=["prompt"]).column("prompt").to_pylist()
        ids = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in msgs]
        verl = [len(x["input_ids"] if hasattr(x, "keys") else x) for x in ids]
        assert pf.count_lengths(msgs, tok, {}) == verl
        # the process pool gives the same numbers
        assert pf.count_many(msgs, tok, str(model_dir), {}, workers=2, min_pool=1) == verl


def test_nothing_too_long_keeps_the_files_and_turns_verls_filter_off(
    env: None, model_dir: Path, data: Path, tmp_path: Path  # noqa: F811
) -> None:
    c = _config(data, model_dir, tmp_path)
    assert c.data.filter_overlong_prompts is True and c.prompt_filter.enabled is True
    results = pf.apply(c, tmp_path / "prompts")
    assert results is not None and [r.split for r in results] == ["train", "val"]
    assert c.data.filter_overlong_prompts is False
    assert c.data.train_files == f"{data}/b1/train.parquet" and c.data.val_files == f"{data}/b1/validation.parquet"
    train = results[0]
    assert train.rows == pq.ParquetFile(data / "b1" / "train.parquet").metadata.num_rows == 300
    assert train.dropped == 0 and 100 < train.longest <= 512 and train.from_cache == 0
    assert "none dropped" in train.describe()
    # a second phase start reads every length from the cache, here for the same prompts in another file
    copy = tmp_path / "other.parquet"
    pq.write_table(pq.read_table(data / "b1" / "train.parquet"), copy)
    again = _config(data, model_dir, tmp_path, f"data.train_files={copy}")
    second = pf.apply(again, tmp_path / "prompts")
    assert second is not None and second[0].from_cache == 300 and second[1].from_cache == results[1].rows
    rec = json.loads(pf.record(tmp_path / "ckpt", second).read_text())
    assert rec["splits"][0]["rows"] == 300 and rec["splits"][0]["dropped"] == 0 and rec["error"] is None


def test_too_long_prompts_are_dropped_by_id_into_new_files(
    env: None, model_dir: Path, data: Path, tmp_path: Path  # noqa: F811
) -> None:
    from transformers import AutoTokenizer

    msgs = pq.read_table(data / "b1" / "train.parquet").column("prompt").to_pylist()
    lengths = pf.count_lengths(msgs, AutoTokenizer.from_pretrained(model_dir), {})
    limit = sorted(lengths)[len(lengths) // 2]  # about half are longer
    over = sum(n > limit for n in lengths)
    c = _config(data, model_dir, tmp_path, f"data.max_prompt_length={limit}")
    results = pf.apply(c, tmp_path / "prompts")
    assert results is not None
    train = results[0]
    assert train.dropped == over > 0 and len(train.dropped_ids) == over and train.limit == limit
    ids = [info["id"] for info in pq.read_table(data / "b1" / "train.parquet").column("extra_info").to_pylist()]
    assert train.dropped_ids == [i for i, n in zip(ids, lengths, strict=True) if n > limit]
    kept = pq.read_table(c.data.train_files)
    assert c.data.train_files != f"{data}/b1/train.parquet" and kept.num_rows == 300 - over
    assert f"{over} dropped as too long" in train.describe() and train.dropped_ids[0] in train.describe()


def test_all_too_long_is_an_error_and_disabled_leaves_verls_filter(
    env: None, model_dir: Path, data: Path, tmp_path: Path  # noqa: F811
) -> None:
    c = _config(data, model_dir, tmp_path, "data.max_prompt_length=5")
    with pytest.raises(ValueError, match=r"data.train_files: all 300 prompts are longer than data.max_prompt_length 5"):
        pf.apply(c, tmp_path / "prompts")
    off = _config(data, model_dir, tmp_path, "prompt_filter.enabled=false")
    assert pf.apply(off, tmp_path / "prompts") is None and off.data.filter_overlong_prompts is True


def test_the_launcher_copies_the_record_into_the_phase_result(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What VERL's process recorded (dropped rows, or why it stopped) reaches phase_result.json."""
    from trainer.phases import launch
    from trainer.phases.launch import PhaseRun
    from trainer.registry.phases import get_phase

    ids = [f"doc-{i}" for i in range(30)]
    dropped = pf.SplitFilter("train", ["t.parquet"], rows=100, dropped=30, limit=512, longest=9000, dropped_ids=ids)

    def fake_verl(run: PhaseRun, **_: Any) -> int:
        pf.record(launch.checkpoint_dir(run.out_dir), [dropped])
        return 0

    run = PhaseRun(get_phase("b1"), "gpu", tmp_path / "d", tmp_path / "o", "/m", "http://127.0.0.1:1")
    monkeypatch.setattr(launch, "launch", fake_verl)
    res = launch.run_phase(run, export=False)
    assert res.length_filter == [{
        "split": "train", "rows": 100, "dropped": 30, "limit_key": "data.max_prompt_length", "limit": 512,
        "longest": 9000, "first_dropped_ids": ids[: pf.SHOWN_IDS], "used_files": [],
    }]  # fmt: skip
    assert json.loads((tmp_path / "o" / "phase_result.json").read_text())["length_filter"] == res.length_filter

    def all_too_long(run: PhaseRun, **_: Any) -> int:
        pf.record(launch.checkpoint_dir(run.out_dir), [], error="data.train_files: all 3 prompts are longer than x")
        return 1

    monkeypatch.setattr(launch, "launch", all_too_long)
    res = launch.run_phase(run, export=False)
    assert res.status == "failed" and res.error == "data.train_files: all 3 prompts are longer than x"
    assert res.length_filter == []

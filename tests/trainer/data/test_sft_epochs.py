"""SFT epochs chosen on validation (trainer/data/sft_epochs.py): an epoch's steps counted as VERL's SFT
trainer counts them and the lowest validation loss at an epoch's end chosen. A real SFT phase that validates,
saves and exports that epoch runs in pi1-ab's test (tests/trainer/runs/test_ab_experiments_cpu.py: A1 and A2
with epoch selection, two epochs of one step)."""

from __future__ import annotations

import math
import re

import pytest
from omegaconf import OmegaConf

from tests.trainer.data.test_length_report import model_dir  # noqa: F401 (a fixture)
from trainer.data import sft_epochs as se


@pytest.mark.parametrize(
    ("rows", "batch", "dp", "steps"),
    [
        (35797, 32, 1, 1118),  # the golden train split at the gpu profile: VERL logged 1118 steps an epoch
        (36004, 32, 1, 1125),  # that split reweighted by source (--sft-mix): VERL logged 1125
        (35797, 32, 2, 1118),  # 17,898 rows a rank, batches of 16
        (35797, 128, 1, 279),
        (10, 4, 4, 2),  # 2 rows a rank, batches of 1
        (7, 4, 2, 1),  # 3 rows a rank, batches of 2: one step, the odd row dropped
    ],
)
def test_steps_per_epoch_as_verls_sampler_and_loader_count_them(rows: int, batch: int, dp: int, steps: int) -> None:
    assert se.steps_per_epoch(rows, batch, dp) == steps


@pytest.mark.parametrize(
    ("rows", "batch", "dp", "message"),
    [
        (100, 6, 4, "data.train_batch_size: 6 is not a positive multiple of the 4 data-parallel ranks"),
        (100, 0, 1, "data.train_batch_size: 0 is not a positive multiple"),
        (3, 4, 1, "data.train_batch_size: 4 is larger than the 3 train rows"),
        (100, 4, 0, "trainer.n_gpus_per_node x trainer.nnodes: 0"),
    ],
)
def test_an_epoch_that_cannot_be_counted_names_the_setting(rows: int, batch: int, dp: int, message: str) -> None:
    with pytest.raises(se.EpochPlanError, match=re.escape(message)):
        se.steps_per_epoch(rows, batch, dp)


def _config(enabled: bool = True, **data: object) -> object:
    return OmegaConf.create(
        {
            "epoch_selection": {"enabled": enabled},
            "data": {"train_batch_size": 32, "train_files": "t.parquet", "val_files": "v.parquet", **data},
            "trainer": {"n_gpus_per_node": 2, "nnodes": 1, "total_epochs": 3},
        }
    )


def test_the_plan_gives_verl_the_epochs_steps_for_validation_and_checkpoints() -> None:
    p = se.plan(_config(), 35797)
    assert p is not None
    assert (p.rows, p.batch_size, p.dp_size, p.steps_per_epoch, p.total_epochs) == (35797, 32, 2, 1118, 3)
    assert p.overrides == ["trainer.test_freq=1118", "trainer.save_freq=1118"]
    capped = se.plan(_config(train_max_samples=64), 35797)  # VERL reads only the first 64 rows
    assert capped is not None and (capped.rows, capped.steps_per_epoch) == (64, 2)
    assert se.plan(_config(enabled=False), 35797) is None
    with pytest.raises(se.EpochPlanError, match=r"data\.val_files: epoch_selection needs a validation split"):
        se.plan(_config(val_files=None), 35797)


def _val(step: int, loss: float) -> dict[str, object]:
    return {"step": step, "data": {"val/loss": loss}}


def test_the_lowest_validation_loss_at_a_checkpoint_is_chosen() -> None:
    metrics = [
        {"step": 1, "data": {"train/loss": 0.01}},  # a train loss is never read
        _val(100, 0.30),
        _val(150, 0.05),  # no checkpoint at 150: not a candidate
        _val(200, 0.21),
        _val(300, 0.24),
    ]
    c = se.choose(metrics, [100, 200, 300], 100)
    assert c is not None
    assert [(p["epoch"], p["step"], p["val_loss"]) for p in c.curve] == [
        (1.0, 100, 0.30),
        (2.0, 200, 0.21),
        (3.0, 300, 0.24),
    ]
    assert (c.chosen_step, c.chosen_epoch, c.chosen_val_loss) == (200, 2.0, 0.21)


def test_a_tie_keeps_the_earlier_epoch_and_no_finite_loss_chooses_nothing() -> None:
    c = se.choose([_val(10, 0.2), _val(20, 0.2)], [10, 20], 10)
    assert c is not None and c.chosen_step == 10
    assert se.choose([_val(10, math.nan), {"step": 20, "data": {}}], [10, 20], 10) is None
    assert se.choose([_val(10, 0.2)], [], 10) is None


"""bench/step_floor.py: packing into micro batches, one update measured on CPU, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import step_floor
from tests.trainer.phases.test_launch import env  # noqa: F401  (a fixture)


def test_sequences_are_packed_in_order_up_to_the_token_budget() -> None:
    seqs = [[0] * n for n in (5, 4, 3, 9, 1)]
    assert step_floor._micro_batches(seqs, 9) == [[0, 1], [2], [3], [4]]
    assert step_floor._micro_batches(seqs, 100) == [[0, 1, 2, 3, 4]]
    assert step_floor._micro_batches([[0] * 20], 9) == [[0]]  # a sequence over the budget is a batch of its own


def test_an_update_is_measured_per_mini_batch_and_reported(
    default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.common

    monkeypatch.setattr(bench.common, "RESULTS_DIR", tmp_path / "results")
    prompts = [[1, 9690, 198, 2683], [1, 9690, 198, 7390, 2]]
    responses = [[2683, 28, 2], [28, 2], [1500, 1501, 1502, 2], [2]]  # n = 2 a prompt
    data = tmp_path / "gen.responses.json"
    data.write_text(json.dumps({"prompts": prompts, "n": 2, "responses": responses}))
    lines = tmp_path / "gen.jsonl"
    row = step_floor.measure_update(
        default_model_dir, data, lines, mini_batch=3, max_tokens=12, device="cpu", profile=True
    )
    assert row["mini_batches"] == 2 and len(row["mini_batch_s"]) == 2
    assert row["tokens"] == sum(len(prompts[i // 2]) + len(r) for i, r in enumerate(responses))
    assert row["top_ops"] and all(o["self_ms"] >= 0 for o in row["top_ops"])
    payload = step_floor.report(lines, name="step_floor_test", notes="a note")
    md = (tmp_path / "results" / "step_floor_test.md").read_text()
    assert payload["update"][0]["update_s"] == row["update_s"] and "| op (one mini batch) |" in md and "a note" in md


def test_a_report_without_measurements_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "none.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no measurement"):
        step_floor.report(empty)


def test_the_measured_work_is_b1s_in_the_gpu_profile_as_the_launcher_composes_it(env: None) -> None:  # noqa: F811
    from tests.trainer.phases.test_gpu_profile import composed_command, gpu_run

    c = composed_command(gpu_run("b1"))
    work = step_floor.b1_work()
    assert (work["prompts"], work["n"]) == (c.data.train_batch_size, c.actor_rollout_ref.rollout.n)
    assert work["mini_batch"] == c.actor_rollout_ref.actor.ppo_mini_batch_size * c.actor_rollout_ref.rollout.n
    assert work["micro_tokens"] == c.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert work["max_tokens"] == c.data.max_response_length
    rollout = c.actor_rollout_ref.rollout
    assert (
        rollout.max_num_seqs,
        rollout.max_num_batched_tokens,
    ) == (step_floor.PROFILE_MAX_NUM_SEQS, step_floor.PROFILE_MAX_BATCHED_TOKENS)

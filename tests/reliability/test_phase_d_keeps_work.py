"""Phase D keeps its work: `trainer evaluate pipeline` against fault-injecting executors (real HTTP servers, uvicorn).

An output folder that cannot take the outputs is refused before any request; a document the executor refuses
(HTTP 400) is counted and named while the others are scored; a dead executor leaves the answers received on disk
and a rerun asks only for the rest; a hung executor costs one timeout; other generation settings start over.
Requests are counted at the executors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from shared import GoldenExample, read_golden
from tests.helpers.fault_injecting_executor import FaultInjectingDyingExecutor
from tests.helpers.faulty_executor import FaultyExecutor
from trainer.cli import app
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.generation import GenerationSettings
from trainer.evaluation.two_stage import stage2_on_prediction

TEST = SAMPLE_DIR / "common_test_schemas.jsonl"
EXAMPLES = read_golden(TEST)  # 6 documents
SCHEMA = json.dumps(EXAMPLES[0].schema_dict())  # π1's answer to every document: a valid schema, so π2 is asked
TABLE = '{"a": 1}'


def evaluate(out: Path, pi1: FaultyExecutor, pi2: FaultyExecutor, *extra: str) -> Any:
    setting = f"x={pi1.url},{pi1.model},{pi2.url},{pi2.model}"
    args = ["evaluate", "pipeline", "--golden", str(TEST), "--out", str(out), "--setting", setting,
            "--max-tokens", "64", *extra]  # fmt: skip
    return CliRunner().invoke(app, args, env={"COLUMNS": "400"})


def flat(text: str) -> str:
    """The output as one line (rich boxes and wraps long messages)."""
    return " ".join(text.replace("│", " ").split())


@contextmanager
def executors(**pi2: Any) -> Iterator[tuple[FaultyExecutor, FaultyExecutor]]:
    with FaultyExecutor("ok", content=SCHEMA) as a, FaultyExecutor(**{"mode": "ok", "content": TABLE, **pi2}) as b:
        yield a, b


def kept_lines(out: Path) -> list[dict[str, Any]]:
    path = out / "predictions_x.partial.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def stage2_sizes(examples: Sequence[GoldenExample]) -> list[int]:
    prompts = [stage2_on_prediction(ex.text, SCHEMA) for ex in examples]
    return [sum(len(m["content"]) for m in p or []) for p in prompts]


def test_an_unwritable_out_is_refused_before_any_request(tmp_path: Path, record_property: Any) -> None:
    """`--out` below a regular file (it cannot be created): refused before any request."""
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    out = blocker / "eval"
    with executors() as (pi1, pi2):
        res = evaluate(out, pi1, pi2)
        requests = pi1.calls + pi2.calls
    record_property("tried", "`evaluate pipeline --out` below a regular file (a folder that cannot be written)")
    record_property("expected", "exit 2 before any request: one line naming --out, the folder and the reason")
    text = flat(res.output)
    record_property("observed", f"exit {res.exit_code}; {requests} requests; {text[text.find(str(out)) :][:120]}")
    assert res.exit_code == 2 and requests == 0, res.output
    assert "--out" in text and f"{out}: cannot write there (Not a directory)" in text


def test_a_refused_document_is_counted_and_named_while_the_others_are_scored(
    tmp_path: Path, record_property: Any
) -> None:
    """π2's executor answers vLLM's context-length 400 for the longest document's Stage-2 prompt."""
    sizes = stage2_sizes(EXAMPLES)
    longest = max(range(len(EXAMPLES)), key=sizes.__getitem__)
    doc = EXAMPLES[longest].id
    with executors(too_long_chars=sizes[longest] - 1) as (pi1, pi2):
        failed = evaluate(tmp_path, pi1, pi2)
        calls = pi1.calls + pi2.calls
        passed = evaluate(tmp_path, pi1, pi2, "--max-refused-share", "0.5")
        again = pi1.calls + pi2.calls - calls
    record_property("tried", "one of 6 documents refused by π2's executor (HTTP 400, prompt over its context)")
    record_property("expected", "that document counted and named (refused 1 of 6), the others scored, the report "
                    "written, then exit 2 past --max-refused-share; allowed: exit 0, no request again")  # fmt: skip
    text = flat(failed.output)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    refused = metrics["settings"]["x"]["refused"]["table"]
    record_property(
        "observed",
        f"exit {failed.exit_code}, {calls} requests (6 + 6, one each); metrics refused {refused['refused']} of "
        f"{refused['answers']} ({refused['ids']}); rerun with the share allowed: exit {passed.exit_code}, "
        f"{again} requests",
    )
    assert failed.exit_code == 2 and calls == 12, failed.output
    assert "setting 'x', π2 tables: the executor refused 1 of 6 prompts" in text and doc in text, text
    assert refused == {"refused": 1, "answers": 6, "share": 1 / 6, "ids": [doc]}
    assert f"| x | table | 1 | 6 | 16.7% | {doc} |" in (tmp_path / "report.md").read_text()
    records = [json.loads(line) for line in (tmp_path / "predictions_x.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [ex.id for ex in EXAMPLES]
    for i, r in enumerate(records):
        assert r["table_refused"] is (i == longest) and r["table_prediction"] == ("" if i == longest else TABLE)
    assert "maximum context length" in records[longest]["table_refusal"]
    assert passed.exit_code == 0 and again == 0, passed.output


def test_a_dead_executor_keeps_the_answers_and_a_rerun_sends_only_the_rest(
    tmp_path: Path, record_property: Any
) -> None:
    """π2's executor dies at its 4th request (of 6); rerun against it restarted at the same URL."""
    with (
        FaultyExecutor("ok", content=SCHEMA) as pi1,
        FaultInjectingDyingExecutor(4, content=TABLE) as pi2,
    ):
        died = evaluate(tmp_path, pi1, pi2, "--concurrency", "1", "--timeout", "5")
        assert pi2.died.is_set()
        kept = kept_lines(tmp_path)
        tables = sum(r["stage"] == "stage2" for r in kept)
        final_after_death = (tmp_path / "predictions_x.jsonl").exists()
        first_pi1 = pi1.calls
        with pi2.restarted() as back:
            rerun = evaluate(tmp_path, pi1, back, "--concurrency", "1", "--timeout", "5")
            sent = (pi1.calls - first_pi1, back.calls)
    record_property("tried", "π2's executor dies at its 4th of 6 requests (server stopped, port refusing); rerun "
                    "the same command against it restarted at the same URL")  # fmt: skip
    record_property("expected", "exit 1 naming the executor; the answers received kept on disk, no final file; "
                    "the rerun sends only the missing requests and writes all 6 records")  # fmt: skip
    text = flat(died.output)
    record_property(
        "observed",
        f"exit {died.exit_code}; kept {len(kept) - tables} schemas + {tables} tables; final file "
        f"{'present' if final_after_death else 'absent'}; rerun: exit {rerun.exit_code}, sent π1 {sent[0]}, "
        f"π2 {sent[1]}",
    )
    assert died.exit_code == 1, died.output
    assert f"at {pi2.url}/v1/chat/completions" in text and "setting 'x', Stage 2" in text, text
    assert "answers of setting 'x' are kept in" in text and "continues from them" in text
    assert len(kept) - tables == 6 and tables == 3 and not final_after_death
    assert rerun.exit_code == 0, rerun.output
    assert sent == (0, 6 - tables)
    records = [json.loads(line) for line in (tmp_path / "predictions_x.jsonl").read_text().splitlines()]
    assert [r["table_prediction"] for r in records] == [TABLE] * 6


def test_a_hung_executor_costs_one_timeout(tmp_path: Path, record_property: Any) -> None:
    """π1's executor accepts and never answers; --timeout 1 with 3 attempts allowed per call."""
    timeout = 1.0
    with FaultyExecutor("hang", hang_s=60.0) as pi1, FaultyExecutor("ok", content=TABLE) as pi2:
        start = time.monotonic()
        res = evaluate(tmp_path, pi1, pi2, "--timeout", str(timeout), "--limit", "3")
        took = time.monotonic() - start
        calls = pi1.calls
    record_property("tried", f"π1's executor hangs; `evaluate pipeline --timeout {timeout:g}` on 3 documents")
    record_property("expected", "the run fails after about one timeout (< 2×), one request per document, the "
                    "executor and the reason named")  # fmt: skip
    record_property("observed", f"exit {res.exit_code} after {took:.2f} s; {calls} requests")
    assert res.exit_code == 1, res.output
    assert "no answer within 1.0 s (the call's deadline, its retries included)" in flat(res.output)
    assert took < 2 * timeout and calls == 3


def test_changed_generation_settings_do_not_reuse(tmp_path: Path, record_property: Any) -> None:
    """A finished evaluation run again as it was, then with another concurrency."""
    with executors() as (pi1, pi2):
        first = evaluate(tmp_path, pi1, pi2)
        n1 = pi1.calls + pi2.calls
        same = evaluate(tmp_path, pi1, pi2)
        n2 = pi1.calls + pi2.calls - n1
        other = evaluate(tmp_path, pi1, pi2, "--concurrency", "2")
        n3 = pi1.calls + pi2.calls - n1 - n2
    text = flat(other.output)
    default = GenerationSettings().concurrency
    record_property("tried", f"one evaluation run, run again unchanged, then with --concurrency 2 instead of {default}")
    record_property("expected", "unchanged: every answer reused (0 requests); another concurrency: started over, "
                    "both values named, every request sent again")  # fmt: skip
    record_property("observed", f"requests {n1}, then {n2}, then {n3}; "
                    f"{text[text.find('starting over') :][:80]}")  # fmt: skip
    assert first.exit_code == same.exit_code == other.exit_code == 0, (first.output, same.output, other.output)
    assert n1 == 12 and n2 == 0 and n3 == 12
    assert "12 answers kept from an earlier run" in flat(same.output)
    assert f"starting over: generation.concurrency: {default} → 2" in text, text

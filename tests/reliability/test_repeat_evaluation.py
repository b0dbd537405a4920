"""Evaluations that repeat: the same setting evaluated twice gives the same answers and the same scores.

A real vLLM-CPU executor (the session's ``cpu_executor``: SmolLM2 as π1 and π2) and Phase D's own runner and
scoring (``run_pipeline``, ``write_outputs``; π2 also on the gold schemas, as the experiments evaluate it, since
the untrained π1 seldom writes a valid schema), twice at one concurrency over the sample test documents
(``trainer/data/sample``). The contract on GPUs (eager, no prefix caching, a fixed concurrency) and what was
measured there: docs/reliability.md#evaluations-that-repeat. vLLM-CPU has no such switches: it runs eager with
prefix caching on, which is what this test holds it to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.executor_vllm.cpu_launcher import CpuExecutor
from shared import read_golden
from trainer.data.sample_data import SAMPLE_DIR
from trainer.evaluation.generation import GenerationClient, GenerationConfig
from trainer.evaluation.inference import infer
from trainer.evaluation.phase_d import Setting, normalize_prediction_record, run_pipeline, write_outputs
from trainer.serving.executors import serving_mode

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CONCURRENCY = 4
MAX_TOKENS = 32  # answers cut here are compared as they are; a longer limit only costs CI time
ANSWERS = ("schema_prediction", "table_prediction")


def test_the_same_setting_evaluated_twice_repeats(
    cpu_executor: CpuExecutor, tmp_path: Path, record_property: Any
) -> None:
    """The same setting evaluated twice on vLLM-CPU at one concurrency: byte-identical predictions, equal metrics."""
    examples = read_golden(SAMPLE_DIR / "common_test_schemas.jsonl")
    name = cpu_executor.served_model_name
    setting = Setting("pipeline", cpu_executor.url, name, cpu_executor.url, name)
    gen = GenerationConfig(max_tokens=MAX_TOKENS, concurrency=CONCURRENCY, timeout_s=600)
    mode = serving_mode(cpu_executor)
    record_property(
        "tried",
        f"one setting (SmolLM2 as π1 and π2 on one vLLM-CPU executor; π2 also on the gold schemas) evaluated twice "
        f"at concurrency {CONCURRENCY} over the {len(examples)} sample test documents",
    )
    record_property("expected", "byte-identical predictions (π1 schemas, π2 tables) and identical metrics.json")
    runs = []
    for run in ("first", "second"):
        out = tmp_path / run
        on_gold = infer("stage2", examples, GenerationClient(cpu_executor.url, name, gen))
        preds = {
            "pipeline": run_pipeline(setting, examples, gen),
            "pi2_gold": [normalize_prediction_record(r) for r in on_gold],
        }
        write_outputs(
            out, examples, preds, "repeat", max_tokens=MAX_TOKENS, max_truncated_share=1.0,
            serving=dict.fromkeys(preds, mode), concurrency=CONCURRENCY,
        )  # fmt: skip
        runs.append(out)
    files = sorted(p.name for p in runs[0].glob("predictions_*.jsonl"))
    assert files == ["predictions_pi2_gold.jsonl", "predictions_pipeline.jsonl"]
    first = {f: (runs[0] / f).read_bytes() for f in files}
    second = {f: (runs[1] / f).read_bytes() for f in files}
    answers = differ = 0
    for f in files:
        for a, b in zip(first[f].splitlines(), second[f].splitlines(), strict=True):
            ra, rb = json.loads(a), json.loads(b)
            for key in ANSWERS:
                if ra.get(key) is not None:
                    answers += 1
                    differ += ra[key] != rb.get(key)
    metrics = [json.loads((out / "metrics.json").read_text()) for out in runs]
    served = metrics[0]["serving"]["pipeline"]
    same_preds, same_metrics = first == second, metrics[0] == metrics[1]
    record_property(
        "observed",
        f"{answers - differ} of {answers} answers identical; predictions {'byte-identical' if same_preds else 'differ'}"
        f"; metrics {'equal' if same_metrics else 'differ'}; serving: vLLM {served['vllm_build']}, eager "
        f"{served['eager']}, prefix caching {served['prefix_caching']}",
    )
    assert served == {
        "vllm_build": "CPU", "eager": True, "prefix_caching": True, "batch_invariant": False,
        "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS,
    }  # fmt: skip
    assert differ == 0, f"{differ} of {answers} answers differ between the two runs"
    assert same_preds and same_metrics

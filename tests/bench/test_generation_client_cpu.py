"""The eval-client CPU bench without vLLM: revision specs, loading an earlier generation.py, the summaries,
the generated findings and the report."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from bench import generation_client_cpu as gcc
from bench.common import resolve_commit
from trainer.evaluation import generation


def test_before_specs_take_an_optional_label() -> None:
    assert gcc.parse_before("ba05f8f=httpx, default pool") == ("ba05f8f", "httpx, default pool")
    assert gcc.parse_before(" HEAD~2 ") == ("HEAD~2", "HEAD~2")
    assert gcc.parse_before("abc=") == ("abc", "abc")
    with pytest.raises(ValueError):
        gcc.parse_before("=label")


def test_working_tree_is_the_imported_module() -> None:
    code, module = gcc.load_generation(None)
    assert code == "working tree" and module is generation


def test_a_revision_loads_as_a_module_of_its_own() -> None:
    code, module = gcc.load_generation("HEAD")
    assert len(code) == 40 and module is not generation
    assert module.__name__ not in sys.modules  # not left registered
    cfg = module.GenerationConfig(max_tokens=4, concurrency=8, timeout_s=600)
    client = module.GenerationClient("http://127.0.0.1:1/v1", "m", cfg)
    assert client.url == "http://127.0.0.1:1/v1/chat/completions" and client.gen.concurrency == 8


def test_unknown_revision_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown git revision"):
        resolve_commit("no-such-revision-anywhere")


def test_rotation_starts_each_round_one_later() -> None:
    assert [gcc.rotation(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_differing_counts_changed_missing_and_extra_outputs() -> None:
    assert gcc.differing(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert gcc.differing(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert gcc.differing(["a", "b", "c"], ["a", "b"]) == 1
    assert gcc.differing(["a"], ["a", "b"]) == 1


def _payload() -> dict[str, Any]:
    ref = ["x"] * 4
    variants = [
        gcc.summarise_variant("httpx, default pool", "b" * 40, [0.012, 0.010, 0.016], [2.0, 4.0, 1.0], 4,
                              [ref, ref, ref], ref),
        gcc.summarise_variant("aiohttp", "working tree", [0.002, 0.004, 0.003], [2.0, 2.0, 2.0], 4,
                              [ref, ["x", "y", "x", "x"], ref[:3]], ref),
    ]  # fmt: skip
    p: dict[str, Any] = {
        "run": {
            "timestamp": "t", "command": "python -m bench generation-client-cpu", "quick": False, "noisy": False,
            "loadavg_1m_at_start": 0.1, "machine": {"cpu": "c", "cores": 2, "ram_gib": 1.0},
            "versions": {"python": "3.11", "vllm": "0.32", "fastapi": "f", "uvicorn": "u", "project_commit": "x"},
        },
        "model": "m", "executor_url": "u", "prompts": "Stage-1", "requests": 4, "concurrency": 256,
        "max_tokens": 4, "timeout_s": 600, "rounds": 3, "output_reference": "aiohttp, round 1",
        "round_orders": [["httpx, default pool", "aiohttp"], ["aiohttp", "httpx, default pool"]],
        "working_tree_generation_py_differs_from_head": False, "variants": variants,
    }  # fmt: skip
    p["ratios"] = gcc.ratios(variants)
    p["outputs"] = gcc.outputs_check(variants, 4)
    p["findings"] = gcc.findings(p)
    return p


def test_summary_medians_and_ratio() -> None:
    p = _payload()
    before, after = p["variants"]
    assert before["cpu_ms_per_request"] == [3.0, 2.5, 4.0] and before["median_cpu_ms_per_request"] == 3.0
    assert before["requests_per_s"] == [2.0, 1.0, 4.0] and before["median_requests_per_s"] == 2.0
    assert after["median_cpu_ms_per_request"] == 0.75 and after["median_wall_seconds"] == 2.0
    assert after["outputs_per_round"] == [4, 4, 3]
    assert after["differing_from_reference_per_round"] == [0, 1, 1]
    assert p["ratios"] == [{"before": "httpx, default pool", "after": "aiohttp", "ratio": 4.0}]
    assert p["outputs"] == {"every_request_answered": False, "identical_greedy_texts": False,
                            "differing_outputs_total": 2}  # fmt: skip
    assert gcc.ratios(p["variants"][:1]) == []


def test_findings_come_from_the_numbers() -> None:
    f = _payload()["findings"]
    assert f[0].startswith("httpx, default pool (`bbbbbbbbbbbb`) spends 3 CPU ms per request, 4.00× the 0.75 ms")
    assert "every round of httpx, default pool was above every round of aiohttp" in f[0]
    assert "httpx, default pool 333, aiohttp 1,333" in f[1]
    assert "(the fastest 1.00× the slowest)" in f[2]
    assert f[3].startswith("NOT every request was answered")
    assert f[4].startswith("2 outputs over all rounds differ")


def test_findings_say_when_rounds_overlap_and_outputs_agree() -> None:
    ref = ["x"] * 4
    vs = [
        gcc.summarise_variant("a", "a" * 40, [0.004, 0.012], [1.0, 1.0], 4, [ref, ref], ref),
        gcc.summarise_variant("b", "working tree", [0.008, 0.010], [1.0, 1.0], 4, [ref, ref], ref),
    ]
    p = {"variants": vs, "ratios": gcc.ratios(vs), "outputs": gcc.outputs_check(vs, 4), "requests": 4,
         "rounds": 2, "output_reference": "b, round 1"}  # fmt: skip
    f = gcc.findings(p)
    assert "the rounds' ranges overlap" in f[0]
    assert f[-2] == "Every variant answered all 4 requests in each of its 2 round(s)."
    assert f[-1] == "The greedy texts of every variant and round are identical to b, round 1's."


def test_report_has_every_variant_the_ratio_and_the_findings() -> None:
    md = gcc.render_md(_payload())
    assert "| httpx, default pool | `bbbbbbbbbbbb` | 3.000 | 3.000, 2.500, 4.000 | 2.0, 4.0, 1.0 | 2.00 |" in md
    assert "| aiohttp | `working tree` | 0.750 |" in md
    assert "| httpx, default pool / aiohttp | **4.00×** |" in md
    assert "| aiohttp | 4, 4, 3 | 0, 0, 0 | 0, 1, 1 |" in md
    assert "the client's CPU ms per request is the number that carries to a GPU node" in md
    assert "## What the numbers say\n\n- httpx, default pool" in md
    assert "Round orders: httpx, default pool → aiohttp; aiohttp → httpx, default pool." in md

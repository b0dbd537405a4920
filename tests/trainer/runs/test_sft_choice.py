"""``trainer experiment sft-choice``: the candidates and their held-out mixes, the documents each Phase D scores and
keys, the summary read back from scored documents, and the choice rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trainer.cli import app
from trainer.data.sample_data import SAMPLE_DIR
from trainer.runs.config import Candidate, SftChoiceConfig
from trainer.runs.phase_d_part import EvalSet, eval_key
from trainer.runs.sft_choice import METRIC, SftChoice, choose


def test_a_candidate_is_a_name_and_a_mix_and_its_held_out_source_weighs_nothing() -> None:
    plain = Candidate.parse("golden")
    assert plain.name == "golden" and plain.without(None) is None
    mixed = Candidate.parse("mix:invoice=2,people=0.5")
    assert dict(mixed.mix.weights) == {"invoice": 2.0, "people": 0.5} and mixed.without(None) == mixed.mix
    held = mixed.without("invoice")
    assert held is not None and dict(held.weights) == {"invoice": 0.0, "people": 0.5}
    without_product = plain.without("product")
    assert without_product is not None and dict(without_product.weights) == {"product": 0.0}
    for bad, says in (("Mix:a=1", "lower-case"), ("m:invoice", "SOURCE=WEIGHT"), ("m:invoice=-1", ">= 0")):
        with pytest.raises(ValueError, match=f"^candidate: .*{says}"):
            Candidate.parse(bad)


def test_the_config_refuses_a_run_wide_mix_and_repeated_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^sft_mix: each candidate names its own mix"):
        SftChoiceConfig(golden=SAMPLE_DIR, sft_mix="invoice=2", profile="cpu-smoke")
    with pytest.raises(ValueError, match=r"^candidate: names repeat"):
        SftChoiceConfig(golden=SAMPLE_DIR, candidates=("a", "a:invoice=2"), profile="cpu-smoke")


def test_a_candidate_takes_its_own_overrides_and_a_bad_one_is_named() -> None:
    c = SftChoiceConfig(golden=SAMPLE_DIR, profile="cpu-smoke", candidates=("golden", "long"),
                        candidate_overrides=("long:trainer.total_epochs=4",))  # fmt: skip
    assert [(x.name, x.overrides) for x in c.parsed_candidates()] == [
        ("golden", ()), ("long", ("trainer.total_epochs=4",))
    ]
    for bad, says in (("other:trainer.total_epochs=4", "none of the candidates"), ("long", "NAME:KEY=VALUE")):
        with pytest.raises(ValueError, match=f"^candidate_override: .*{says}"):
            SftChoiceConfig(golden=SAMPLE_DIR, profile="cpu-smoke", candidates=("golden", "long"),
                            candidate_overrides=(bad,))  # fmt: skip


def test_an_eval_set_reads_its_source_and_limit_and_keys_them() -> None:
    one = EvalSet("validation", "invoice", 1, per_source=True).read(SAMPLE_DIR)
    assert [e.id.split("-")[0] for e in one] == ["invoice"]
    each = EvalSet("validation", None, 1, per_source=True).read(SAMPLE_DIR)
    assert sorted(e.id.split("-")[0] for e in each) == ["invoice", "people", "product"]
    first = EvalSet("validation", None, 1).read(SAMPLE_DIR)
    assert len(first) == 1  # the split's first document, whatever its source
    assert EvalSet().key(SAMPLE_DIR).keys() == {"test"}  # the recipes' Phase D keeps its key
    keys = [EvalSet("validation", s, 1, per_source=True).key(SAMPLE_DIR) for s in ("invoice", "people", None)]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 3


def test_phase_d_is_keyed_by_the_documents_it_scores(default_model_dir: Path) -> None:
    cfg = SftChoiceConfig(golden=SAMPLE_DIR, profile="cpu-smoke", base_model=str(default_model_dir))
    models = {"golden": (str(default_model_dir), str(default_model_dir))}
    on_test = eval_key(cfg, models)
    held = eval_key(cfg, models, EvalSet("validation", "invoice", None, per_source=True))
    other = eval_key(cfg, models, EvalSet("validation", "people", None, per_source=True))
    assert on_test["golden"].keys() == {"test"} and held["golden"] != other["golden"] != on_test["golden"]
    assert held["settings"] == on_test["settings"]


def _test(base: str, treat: str, scope: str, diff: float, low: float, high: float) -> dict[str, Any]:
    return {"baseline": base, "treatment": treat, "scope": scope, "diff": diff, "ci_low": low, "ci_high": high}


def test_the_choice_is_the_best_on_validation_that_no_other_beats_on_a_held_out_source() -> None:
    names = ["golden", "mix"]
    val = {"golden": 0.50, "mix": 0.56}
    held = {"golden": 0.40, "mix": 0.37}
    tie = [_test("golden", "mix", "e2e", -0.01, -0.04, 0.02), _test("golden", "mix", "macro", -0.03, -0.06, 0.01)]
    assert choose(names, val, held, tie)["chosen"] == "mix"  # within the interval: validation decides
    worse = [_test("golden", "mix", "e2e", -0.05, -0.08, -0.02)]
    verdict = choose(names, val, held, worse)
    assert verdict["chosen"] == "golden" and verdict["beaten_on_held_out"]["mix"] == [
        "e2e: -0.0500 vs golden [-0.0800, -0.0200]"
    ]
    both = [*worse, _test("golden", "mix", "rotowire_sent", 0.06, 0.03, 0.09)]
    verdict = choose(names, val, held, both)
    assert verdict["chosen"] == "golden" and "held-out macro" in verdict["rule"]  # 0.40 > 0.37
    assert verdict["beaten_on_held_out"]["golden"] == ["rotowire_sent: -0.0600 vs mix [-0.0900, -0.0300]"]


def _write_scored(folder: Path, name: str, rows: list[tuple[str, str, float]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "source": s, METRIC: v}) for i, s, v in rows]
    (folder / f"predictions_{name}.jsonl").write_text("\n".join(lines) + "\n")


def test_the_summary_reads_the_scored_documents_of_every_slot(tmp_path: Path, default_model_dir: Path) -> None:
    cfg = SftChoiceConfig(golden=SAMPLE_DIR, profile="cpu-smoke", candidates=("golden", "mix:invoice=2"),
                          held_out=("invoice",), base_model=str(default_model_dir), out=tmp_path)  # fmt: skip
    recipe = SftChoice(cfg)
    assert recipe.slots() == [None, "invoice"]
    val = [(f"{s}-{k}", s, v) for s, v in (("invoice", 0.5), ("people", 0.7)) for k in range(4)]
    _write_scored(recipe.eval_dir(None), "golden", val)
    _write_scored(recipe.eval_dir(None), "mix", [(i, s, v + 0.1) for i, s, v in val])
    held = [(f"invoice-{k}", "invoice", 0.4 + 0.01 * k) for k in range(8)]
    _write_scored(recipe.eval_dir("invoice"), "golden", held)
    _write_scored(recipe.eval_dir("invoice"), "mix", [(i, s, v - 0.2) for i, s, v in held])
    out = recipe.summary(recipe.slots())
    golden, mix = out["candidates"]["golden"], out["candidates"]["mix"]
    assert golden["validation"]["macro"] == pytest.approx(0.6) and mix["validation"]["macro"] == pytest.approx(0.7)
    assert golden["validation"]["per_source"] == pytest.approx({"invoice": 0.5, "people": 0.7})
    assert mix["held_out"]["per_source"]["invoice"] == pytest.approx(golden["held_out"]["per_source"]["invoice"] - 0.2)
    (test,) = out["paired_held_out"]
    assert test["scope"] == "invoice" and test["diff"] == pytest.approx(-0.2) and test["ci_high"] < 0
    assert out["chosen"] == "golden"  # better on validation, but 0.2 worse on the source it never saw


def test_the_command_names_a_held_out_source_the_train_split_lacks() -> None:
    result = CliRunner().invoke(app, ["experiment", "sft-choice", "--golden", str(SAMPLE_DIR), "--profile",
                                      "cpu-smoke", "--held-out", "nosuch", "--dry-run"])  # fmt: skip
    assert result.exit_code == 2
    assert "--held-out" in result.output and "nosuch" in result.output


def test_the_dry_run_prints_each_candidates_mix_without_each_source(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["experiment", "sft-choice", "--golden", str(SAMPLE_DIR), "--profile",
                                      "cpu-smoke", "--candidate", "golden", "--candidate", "mix:invoice=2",
                                      "--candidate-override", "mix:trainer.total_epochs=2",
                                      "--out", str(tmp_path / "run"), "--dry-run"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mix: mix invoice=0, trainer.total_epochs=2;" in result.output and "golden: mix people=0;" in result.output
    assert "without_product: trained without product" in result.output
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_a_phase_d_stopped_by_cut_answers_is_one_line_naming_the_recipes_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    from trainer.evaluation.generation import TruncatedAnswersError
    from trainer.run_cli import REFUSALS, refused

    exc = TruncatedAnswersError("golden stage 1: 2 of 24 answers stopped at max_tokens 384; share 8.3% > 2.0%): "
                                "a cut answer would be scored as wrong. Raise max_tokens\n(--max-tokens), or allow "
                                "the share (--max-truncated-share)")  # fmt: skip
    assert isinstance(exc, REFUSALS)  # the recipes' commands catch it
    assert isinstance(refused(exc), typer.Exit)
    err = capsys.readouterr().err
    assert err.startswith("stopped: golden stage 1") and err.count("\n") == 1
    assert "(--eval-max-tokens)" in err and "(--eval-max-truncated-share)" in err and "(--max-tokens)" not in err


def test_the_report_shows_the_choice_beside_an_ab_experiments_temperature_choice(tmp_path: Path) -> None:
    """run.json's ``sft_choice`` is its own key: the A/B experiments record their temperature under ``choice``."""
    from trainer.runs.record import render

    verdict = {"metric": METRIC, "chosen": "golden", "rule": "the rule", "beaten_on_held_out": {"golden": []},
               "candidates": {"golden": {"validation": {"macro": 0.5, "macro_ci95": [0.4, 0.6]},
                                         "held_out": {"per_source": {"e2e": 0.3}, "per_source_ci95": {"e2e": None},
                                                      "macro": 0.3}}}}  # fmt: skip
    text = render({"choice": {"temperature": 1.3}, "sft_choice": verdict}, tmp_path)
    assert "## The choice: golden" in text and "| golden | 0.500 [0.400, 0.600] | 0.300 | 0.300 | no |" in text
    assert "## The choice" not in render({"choice": {"temperature": 1.3}}, tmp_path)

"""The plan: parts per design, when executors start, are reused and stop, and what a rerun skips."""

from __future__ import annotations

import json
from pathlib import Path

from tests.trainer.runs.test_loop import SAMPLE, recorded
from trainer.runs import phase_d_part
from trainer.runs.ab_plan import (
    DESIGNS,
    ExecutorStep,
    Workdir,
    control_difference,
    eval_models,
    eval_staleness,
    executor_timeline,
    parts,
    preflight_current,
    preflight_key,
    record_control_key,
    record_preflight_key,
)
from trainer.runs.config import ExperimentConfig

PI1, PI2 = DESIGNS["pi1-ab"], DESIGNS["pi2-ab"]


def cfg(tmp_path: Path, **kw: object) -> ExperimentConfig:
    return ExperimentConfig(golden=SAMPLE, out=tmp_path, **kw)  # type: ignore[arg-type]


def test_the_designs_say_what_each_experiment_compares() -> None:
    assert (PI1.start, PI1.partner, PI1.arms, PI1.c2_data) == ("a1", "a2", ("b1", "c1"), False)
    assert PI1.settings() == {"sft": ("a1", "a2"), "local": ("b1", "a2"), "pipe": ("c1", "a2")}
    assert (PI2.start, PI2.partner, PI2.arms, PI2.c2_data, PI2.gold_schema_eval) == (
        "a2",
        "a1",
        ("b2", "c2"),
        True,
        True,
    )
    assert PI2.settings() == {"sft": ("a1", "a2"), "local": ("a1", "b2"), "pipe": ("a1", "c2")}
    assert PI2.data_phases == ("a1", "a2", "b2")
    assert [PI1.served_name(p) for p in ("a1", "a2", "b1", "c1")] == ["pi1-sft", "pi2-sft", "pi1-local", "pi1-pipe"]


def test_pi1_parts_and_what_they_serve(tmp_path: Path) -> None:
    plan = {s.name: s for s in parts(cfg(tmp_path), PI1, Workdir(tmp_path))}
    assert list(plan) == ["sft", "preflight", "choose", "control", "rl", "eval"]
    assert not any(s.done for s in plan.values())
    assert plan["preflight"].executors == ("a1", "a2") and plan["preflight"].reward_apis == ("local", "pipe")
    assert plan["rl"].executors == ("a2",) and plan["rl"].reward_apis == ("local", "pipe")
    assert plan["eval"].executors == ("a1", "a2", "b1", "c1")
    assert plan["control"].beside is None


def test_pi2_c2data_beside_the_preflight_and_control_beside_rl(tmp_path: Path) -> None:
    plan = {s.name: s for s in parts(cfg(tmp_path, control="parallel"), PI2, Workdir(tmp_path))}
    assert list(plan) == ["sft", "preflight", "c2data", "choose", "control", "rl", "eval"]
    assert plan["preflight"].executors == ("a2",) and plan["preflight"].reward_apis == ("local",)
    assert plan["c2data"].executors == ("a1",) and plan["c2data"].beside == "preflight"
    assert plan["control"].beside == "rl"
    assert plan["rl"].executors == () and plan["rl"].reward_apis == ("local",)
    assert "control" not in {s.name for s in parts(cfg(tmp_path, control="off"), PI2, Workdir(tmp_path))}


def test_on_gpus_executors_start_once_and_eval_reuses_them(tmp_path: Path) -> None:
    steps = executor_timeline(parts(cfg(tmp_path), PI1, Workdir(tmp_path)), on_cpu=False)
    assert [s for s in steps if s.start or s.reuse or s.stop] == [
        ExecutorStep("preflight", start=("a1", "a2"), reuse=(), stop=()),
        ExecutorStep("rl", start=(), reuse=("a2",), stop=()),
        ExecutorStep("eval", start=("b1", "c1"), reuse=("a1", "a2"), stop=()),
    ]
    steps2 = executor_timeline(parts(cfg(tmp_path), PI2, Workdir(tmp_path)), on_cpu=False)
    assert [s for s in steps2 if s.start or s.reuse] == [
        ExecutorStep("preflight", start=("a2",), reuse=(), stop=()),
        ExecutorStep("c2data", start=("a1",), reuse=(), stop=()),
        ExecutorStep("eval", start=("b2", "c2"), reuse=("a1", "a2"), stop=()),
    ]


def test_on_cpu_each_part_first_stops_what_it_does_not_need(tmp_path: Path) -> None:
    steps = {s.part: s for s in executor_timeline(parts(cfg(tmp_path, control="off"), PI1, Workdir(tmp_path)), True)}
    assert steps["preflight"].start == ("a1", "a2")
    assert steps["choose"].stop == ()  # no training: nothing to make room for
    # GRPO needs the memory: only the pipeline reward's π2ˢ stays up beside it
    assert steps["rl"] == ExecutorStep("rl", start=(), reuse=("a2",), stop=("a1",))
    assert steps["eval"] == ExecutorStep("eval", start=("a1", "b1", "c1"), reuse=("a2",), stop=())
    # pi2: the preflight's and c2data's executors are up together (c2data runs beside the preflight)
    steps2 = {s.part: s for s in executor_timeline(parts(cfg(tmp_path), PI2, Workdir(tmp_path)), True)}
    assert steps2["c2data"].stop == () and steps2["c2data"].start == ("a1",)


def test_a_rerun_skips_the_parts_whose_results_exist(tmp_path: Path) -> None:
    c, wd = cfg(tmp_path, temps=(1.0, 1.3)), Workdir(tmp_path)
    for p in ("a1", "a2"):
        recorded(wd.phase(p), p, wd.phase(p) / "hf")
    wd.preflight.mkdir()

    def report(p: str, t: float) -> None:
        wd.report(p, t).write_text("{}")
        record_preflight_key(c, PI1, wd, p, t)

    for p in ("b1", "c1"):
        report(p, 1.0)
    done = {s.name for s in parts(c, PI1, wd) if s.done}
    assert done == {"sft"}  # T 1.3 is missing
    for p in ("b1", "c1"):
        report(p, 1.3)
    recorded(wd.phase("b1"), "b1", wd.phase("a1") / "hf")  # early stopping kept step 0: hf_dir is the start
    assert {s.name for s in parts(c, PI1, wd) if s.done} == {"sft", "preflight"}
    recorded(wd.phase("c1"), "c1", wd.phase("c1") / "hf")
    (wd.control("b1")).mkdir()
    (wd.control("b1") / "positive_control.json").write_text("{}")
    wd.improvable("b1").write_text("prompts")
    wd.choice.write_text(json.dumps({"temperature": 1.3}))
    assert "control" in [s.name for s in parts(c, PI1, wd) if not s.done]  # a verdict without its key
    record_control_key(c, PI1, wd)
    wd.phase_d.mkdir()
    (wd.phase_d / "metrics.json").write_text("{}")
    assert [s.name for s in parts(c, PI1, wd) if not s.done] == ["choose", "eval"]  # no key beside its scores
    models = eval_models(PI1, wd)
    assert models is not None
    phase_d_part.record_eval_key(wd.phase_d, phase_d_part.eval_key(c, models))
    assert [s.name for s in parts(c, PI1, wd) if not s.done] == ["choose", "eval"]  # π1's schemas alone: not yet
    wd.stage1_eval.mkdir()
    (wd.stage1_eval / "metrics.json").write_text("{}")
    plan = parts(c, PI1, wd)
    assert [s.name for s in plan if not s.done] == ["choose"]  # pure and cheap: always taken again
    assert executor_timeline(plan, on_cpu=False) == [ExecutorStep("choose", (), (), ())]


def test_phase_ds_scores_are_reused_only_for_the_models_and_settings_they_were_scored_with(tmp_path: Path) -> None:
    """The loop's rule: a changed setting or a retrained model makes the eval part run again, and the plan says
    what changed with both values; an unfinished phase leaves it to run."""
    c, wd = cfg(tmp_path, eval_limit=8), Workdir(tmp_path)
    assert eval_staleness(c, PI1, wd) == "a phase it evaluates has not finished"
    for p in ("a1", "a2", "b1", "c1"):
        recorded(wd.phase(p), p, wd.phase(p) / "hf")
        (wd.phase(p) / "hf" / "model.safetensors").write_text(p)
    wd.phase_d.mkdir()
    (wd.phase_d / "metrics.json").write_text("{}")
    assert eval_staleness(c, PI1, wd) == "no eval_key.json beside its scores"
    models = eval_models(PI1, wd)
    assert models == {"sft": (str(wd.phase("a1") / "hf"), str(wd.phase("a2") / "hf")),
                      "local": (str(wd.phase("b1") / "hf"), str(wd.phase("a2") / "hf")),
                      "pipe": (str(wd.phase("c1") / "hf"), str(wd.phase("a2") / "hf"))}  # fmt: skip
    phase_d_part.record_eval_key(wd.phase_d, phase_d_part.eval_key(c, models))
    assert eval_staleness(c, PI1, wd) is None
    more = eval_staleness(cfg(tmp_path, eval_limit=16), PI1, wd)
    assert more is not None and "'eval_limit': 8" in more and "'eval_limit': 16" in more and "settings" not in more
    (wd.phase("c1") / "hf" / "model.safetensors").write_text("c1, trained again")
    retrained = eval_staleness(c, PI1, wd)
    assert retrained is not None and retrained.startswith("settings: recorded")
    eval_part = next(s for s in parts(c, PI1, wd) if s.name == "eval")
    assert not eval_part.done


def test_c2s_data_is_reused_only_for_the_schema_model_and_settings_it_was_built_with(tmp_path: Path) -> None:
    """pi2-ab's C2 data (π1ˢ's schemas) counts as built only under the loop's precompute key; another
    ``--c2-train-prompts`` or a retrained π1ˢ builds it again."""
    from trainer.runs import c2_data

    c, wd = cfg(tmp_path, c2_train_prompts=64), Workdir(tmp_path)

    def built(config: ExperimentConfig) -> bool:
        return next(s for s in parts(config, PI2, wd) if s.name == "c2data").done

    (wd.data / "c2").mkdir(parents=True)
    for split in ("train", "validation"):
        (wd.data / "c2" / f"{split}.parquet").write_text("rows")
    assert not built(c)  # π1ˢ unfinished: what the rows came from is unknown
    recorded(wd.phase("a1"), "a1", wd.phase("a1") / "hf")
    (wd.phase("a1") / "hf" / "model.safetensors").write_text("a1")
    assert not built(c)  # no key beside the rows
    key = c2_data.precompute_key(c, str(wd.phase("a1") / "hf"), "skip")
    (wd.data / "c2" / c2_data.PRECOMPUTE_KEY).write_text(json.dumps(key))
    assert built(c)
    assert not built(cfg(tmp_path, c2_train_prompts=128))
    (wd.phase("a1") / "hf" / "model.safetensors").write_text("a1, trained again")
    assert not built(c)


def test_a_preflight_report_is_reused_only_for_its_models_and_sweep_settings(tmp_path: Path) -> None:
    """A report counts only beside the key it was made under: another ``--preflight-n`` or a retrained π2 (the
    pipeline reward's frozen model) sweeps again; a local-reward phase does not depend on π2."""
    c, wd = cfg(tmp_path, temps=(1.0,)), Workdir(tmp_path)
    assert preflight_key(c, PI1, wd, "c1", 1.0) is None  # π1ˢ unfinished
    for p in ("a1", "a2"):
        recorded(wd.phase(p), p, wd.phase(p) / "hf")
        (wd.phase(p) / "hf" / "model.safetensors").write_text(p)
    wd.preflight.mkdir()
    for p in ("b1", "c1"):
        wd.report(p, 1.0).write_text("{}")
    assert not preflight_current(c, PI1, wd, "c1", 1.0)  # no key beside the report
    for p in ("b1", "c1"):
        record_preflight_key(c, PI1, wd, p, 1.0)
    assert preflight_current(c, PI1, wd, "c1", 1.0) and preflight_current(c, PI1, wd, "b1", 1.0)
    assert not preflight_current(cfg(tmp_path, temps=(1.0,), preflight_n=4), PI1, wd, "c1", 1.0)
    (wd.phase("a2") / "hf" / "model.safetensors").write_text("a2, trained again")
    assert not preflight_current(c, PI1, wd, "c1", 1.0)  # C1's pipeline reward runs π2
    assert preflight_current(c, PI1, wd, "b1", 1.0)  # B1's local reward does not
    assert not next(s for s in parts(c, PI1, wd) if s.name == "preflight").done


def test_the_positive_controls_verdict_is_reused_only_for_what_it_was_run_from(tmp_path: Path) -> None:
    """The rule of every part: the control counts as done under its key (start policy, improvable prompts,
    temperature, the control's and the run's RL settings); a change is named with both values, and the experiment
    refuses to run it again over the old verdict."""
    import pytest

    from trainer.runs.ab import Experiment
    from trainer.runs.reuse import StaleResultError

    c, wd = cfg(tmp_path), Workdir(tmp_path)
    recorded(wd.phase("a1"), "a1", wd.phase("a1") / "hf")
    (wd.phase("a1") / "hf" / "model.safetensors").write_text("a1")
    wd.preflight.mkdir()
    wd.improvable("b1").write_text("prompts")
    wd.choice.write_text(json.dumps({"temperature": 1.0}))
    assert control_difference(c, PI1, wd) == "no verdict"
    wd.control("b1").mkdir()
    (wd.control("b1") / "positive_control.json").write_text("{}")
    record_control_key(c, PI1, wd)
    assert control_difference(c, PI1, wd) is None
    wd.choice.write_text(json.dumps({"temperature": 1.3}))
    hotter = control_difference(c, PI1, wd)
    assert hotter == "temperature: recorded 1.0, now 1.3"
    wd.choice.write_text(json.dumps({"temperature": 1.0}))
    assert control_difference(cfg(tmp_path, rl_seed=7), PI1, wd) is not None
    (wd.phase("a1") / "hf" / "model.safetensors").write_text("a1, trained again")
    retrained = control_difference(c, PI1, wd)
    assert retrained is not None and retrained.startswith("model: recorded")
    assert not next(s for s in parts(c, PI1, wd) if s.name == "control").done

    def never(*_: object) -> object:
        raise AssertionError("the control ran over a verdict of other inputs")

    exp = Experiment(PI1, c, control_runner=never)  # type: ignore[arg-type]
    with pytest.raises(StaleResultError, match="positive control: model: recorded"):
        exp.part_control()

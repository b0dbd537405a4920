"""The recipe end to end with its servers, phases and clients recorded instead of run (no GPU here; the real run
on CPU is ``test_ab_experiments_cpu.py``): which phases run where and when, which executors start and which are reused,
the temperature choice and the no-headroom stop, the positive control, resumability, the part times."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared import read_golden
from shared.golden import source_of
from tests.trainer.runs.test_loop import SAMPLE
from trainer.checks.positive_control import ControlConfig, ControlVerdict
from trainer.checks.preflight import PromptOutcome, build_report
from trainer.data.precompute import PrecomputeReport
from trainer.phases.launch import PhaseResult, PhaseRun
from trainer.runs.ab import Experiment, ExperimentStopped
from trainer.runs.ab_plan import DESIGNS
from trainer.runs.config import ExperimentConfig
from trainer.runs.reuse import PHASE_INPUTS, StaleResultError
from trainer.serving.endpoint import Endpoint
from trainer.serving.gpus import ExecutorSlot


@dataclass
class Node:
    """What the recording stand-ins saw: executors launched and stopped, phases run, reward APIs, sleeps, scores."""

    events: list[tuple[str, ...]] = field(default_factory=list)
    runs: list[PhaseRun] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    served: dict[str, list[str]] = field(default_factory=dict)  # setting -> the URLs its two stages used
    stage1: list[str] = field(default_factory=list)  # the π1 URL of each Stage-1 run, in order
    schemas_from: dict[tuple[str, ...], str] = field(default_factory=dict)  # a Stage 1's schemas -> its URL
    keep_step0: set[str] = field(default_factory=set)  # arms whose early stopping keeps step 0
    preflight_sources: list[Any] = field(default_factory=list)  # the sources each preflight sweep was given
    preflight_limits: list[int | None] = field(default_factory=list)  # the --limit each sweep drew its prompts under
    control_passes: bool = True
    prefix_caching: list[bool] = field(default_factory=list)  # how each executor was asked to serve

    def launched(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "launch"]


class RecordingExecutorForTests:
    def __init__(self, node: Node, model: str, slot: ExecutorSlot | None, served_name: str) -> None:
        self.node, self.model, self.slot, self.served_name = node, model, slot, served_name
        self.url = f"http://{served_name}"

    def launch(self) -> None:
        self.node.events.append(("launch", self.served_name, ",".join(self.slot.gpus) if self.slot else "cpu"))

    def wait_ready(self, _timeout: float) -> RecordingExecutorForTests:
        return self

    def stop(self) -> None:
        self.node.events.append(("stop", self.served_name))


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Node:
    n = Node()

    def executor_for(model: str, _log: Path, slot: ExecutorSlot | None = None, **kw: Any) -> RecordingExecutorForTests:
        n.prefix_caching.append(kw["prefix_caching"])
        return RecordingExecutorForTests(n, model, slot, kw["served_name"])

    @contextmanager
    def reward_api_process(
        log: Path, *, executors: tuple[Endpoint, ...] = (), workers: int = 1, **_: Any
    ) -> Iterator[Any]:
        kind = log.stem.removeprefix("reward_api_")
        n.events.append(("reward_api", kind, ",".join(e.served_name for e in executors), str(workers)))
        yield type("Api", (), {"url": f"http://reward-{kind}"})()
        n.events.append(("reward_api_stop", kind))

    def advantage_check(golden: Path, reward: str, url: str, model: str, reward_url: str, **kw: Any) -> Any:
        """Every training prompt improvable at T >= 1.3, none below."""
        t, sources = kw["temperature"], kw.get("sources")
        n.events.append(("preflight", reward, model, reward_url, str(t)))
        n.preflight_sources.append(sources)
        n.preflight_limits.append(kw["limit"])
        outcomes = [
            PromptOutcome(ex.id, 0.0, (0.0, 1.0 if t >= 1.3 else 0.0), (True, True))
            for ex in read_golden(golden / "common_train_schemas.jsonl", kw["limit"])
            if sources is None or source_of(ex.id) in sources
        ]
        return build_report(reward, outcomes, t, min_informative=0.0, min_improvable=0.0)

    def precompute_c2(golden: Path, data: Path, _predict: Any, served_name: str, **kw: Any) -> PrecomputeReport:
        """RL rows of the split's documents (of the train sources in train, as the real one draws them)."""
        sources = (kw["sources"] or {}).get("train", ())
        n.events.append(("c2data", served_name, str(kw["sample"]["train"]), ",".join(sources)))
        counts = {}
        for split in ("train", "validation"):
            ids = [ex.id for ex in read_golden(golden / f"common_{split}_schemas.jsonl")]
            if split == "train" and sources:
                ids = [i for i in ids if source_of(i) in sources]
            (data / "c2").mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"extra_info": [{"id": i} for i in ids]}), data / "c2" / f"{split}.parquet")
            counts[split] = len(ids)
        return PrecomputeReport(counts=counts)

    lock = threading.Lock()

    def stage1_schemas(_label: str, pi1: str, examples: Any, serve: Any, *_: Any, **_kw: Any) -> list[str]:
        """Each Stage-1 run's schemas differ (by trailing blanks; the same parsed schema): greedy vLLM is
        not bit-identical across batches, so only a shared run gives the settings the same schemas."""
        with serve(pi1, "stage1") as a, lock:
            n.stage1.append(a.url)
            schemas = [json.dumps(ex.schema_dict()) + " " * len(n.stage1) for ex in examples]
            n.schemas_from[tuple(schemas)] = a.url
        return schemas

    def run_two_stage(
        setting: str, pi1: str, pi2: str, examples: Any, serve: Any, *_: Any, schemas: Any = None, **_kw: Any
    ) -> list[dict[str, Any]]:
        if schemas is None:
            schemas = stage1_schemas(setting, pi1, examples, serve)
        with serve(pi2, "stage2") as b:
            n.served[setting] = [n.schemas_from[tuple(schemas)], b.url]
        return [{"id": ex.id, "setting": setting, "schema_prediction": s, "table_prediction": None,
                 "schema_model": pi1, "table_model": pi2} for ex, s in zip(examples, schemas, strict=True)]  # fmt: skip

    def infer(stage: str, examples: Any, client: Any, out: Path, _generate: Any = None) -> list[dict[str, Any]]:
        n.served[f"gold:{out.stem}"] = [client.base_url if hasattr(client, "base_url") else client.model]
        recs = [{"id": ex.id, "stage": stage, "prediction": ""} for ex in examples]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return recs

    monkeypatch.setattr("trainer.serving.executors.executor_for", executor_for)
    monkeypatch.setattr("trainer.runs.servers.reward_api_process", reward_api_process)
    monkeypatch.setattr("trainer.serving.reward_api.reward_api_process", reward_api_process)
    monkeypatch.setattr("trainer.checks.preflight.advantage_check", advantage_check)
    monkeypatch.setattr("trainer.data.precompute.precompute_c2", precompute_c2)
    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", run_two_stage)
    monkeypatch.setattr("trainer.evaluation.two_stage.stage1_schemas", stage1_schemas)
    monkeypatch.setattr("trainer.evaluation.inference.infer", infer)
    monkeypatch.setattr("time.sleep", n.sleeps.append)
    return n


def runner(node: Node) -> Any:
    def run(r: PhaseRun) -> PhaseResult:
        node.runs.append(r)
        node.events.append(("phase", r.phase.name, ",".join(r.gpus) or "cpu"))
        r.out_dir.mkdir(parents=True, exist_ok=True)
        hf = r.model_path if r.phase.name in node.keep_step0 else str(r.out_dir / "hf")
        Path(hf).mkdir(parents=True, exist_ok=True)
        res = PhaseResult(r.phase.name, r.profile, "ok", 0, r.command(), r.model_path, str(r.data_dir),
                          str(r.out_dir), "t", 1.0, best_step=0 if r.phase.name in node.keep_step0 else 2,
                          hf_dir=hf)  # fmt: skip
        res.write(r.out_dir)
        return res

    return run


def control_runner(node: Node) -> Any:
    def run(r: PhaseRun, prompts: Path, ccfg: ControlConfig) -> tuple[PhaseResult, ControlVerdict]:
        node.events.append(("control", r.phase.name, str(prompts.name)))
        verdict = ControlVerdict(node.control_passes, ccfg.margin, "passed" if node.control_passes else "FAILED")
        r.out_dir.mkdir(parents=True, exist_ok=True)
        (r.out_dir / "positive_control.json").write_text(json.dumps({"verdict": verdict.as_dict()}))
        return PhaseResult(r.phase.name, r.profile, "ok", 0, [], "", "", "", "t", 1.0), verdict

    return run


def experiment(node: Node, tmp_path: Path, name: str = "pi1-ab", **kw: Any) -> Experiment:
    cfg = ExperimentConfig(golden=SAMPLE, out=tmp_path / name, base_model="/base", temps=(1.0, 1.3), **kw)
    return Experiment(DESIGNS[name], cfg, runner=runner(node), control_runner=control_runner(node), say=lambda _m: None)


def test_pi1_on_one_gpu(node: Node, tmp_path: Path) -> None:
    node.keep_step0 = {"b1"}
    exp = experiment(node, tmp_path, gpus=("0",))
    manifest = exp.run()
    wd = exp.wd
    # SFT both on the one GPU; RL at the chosen temperature, arm B staggered (one card)
    assert [(r.phase.name, r.gpus) for r in node.runs] == [
        ("a1", ("0",)),
        ("a2", ("0",)),
        ("b1", ("0",)),
        ("c1", ("0",)),
    ]
    assert json.loads(wd.choice.read_text())["temperature"] == 1.3
    b1, c1 = node.runs[2], node.runs[3]
    assert "actor_rollout_ref.rollout.temperature=1.3" in b1.overrides and b1.model_path == str(wd.phase("a1") / "hf")
    assert (b1.reward_url, c1.reward_url) == ("http://reward-local", "http://reward-pipe")
    assert node.sleeps == [90.0]
    # the preflight's executors start once and eval reuses them; B1 kept step 0, so its π1 is π1ˢ's executor
    assert node.launched() == ["pi1-sft", "pi2-sft", "pi1-pipe"]
    assert not [e for e in node.events if e[0] == "stop"][:-3]  # nothing stopped before the end
    assert ("reward_api", "pipe", "pi2-sft", "8") in node.events and ("reward_api", "local", "", "4") in node.events
    assert {e[1] for e in node.events if e[0] == "preflight"} == {"schema", "pipeline"}
    assert node.served == {
        "sft": ["http://pi1-sft", "http://pi2-sft"],
        "local": ["http://pi1-sft", "http://pi2-sft"],
        "pipe": ["http://pi1-pipe", "http://pi2-sft"],
    }
    assert ("control", "b1", "b1_improvable.parquet") in node.events
    metrics = json.loads((wd.phase_d / "metrics.json").read_text())
    assert list(metrics["settings"]) == ["sft", "local", "pipe"] and metrics["paired_tests"]
    # evaluation's executors run without prefix caching; the serving mode is recorded per setting
    assert node.prefix_caching == [False] * 3
    assert metrics["serving"]["pipe"]["concurrency"] == exp.cfg.eval_concurrency
    stage1 = json.loads((wd.stage1_eval / "metrics.json").read_text())
    assert list(stage1["settings"]) == ["sft", "local", "pipe"]
    assert {t["metric"] for t in stage1["paired_tests"]} == {"schema_f1"}
    parts = manifest["parts"]
    assert all(parts[s]["status"] == "ok" for s in ("sft", "preflight", "choose", "control", "rl", "eval"))
    assert all(isinstance(parts[s]["seconds"], float) for s in ("sft", "rl", "eval"))
    n_test = len(read_golden(SAMPLE / "common_test_schemas.jsonl"))
    assert manifest["phase_d"]["phase_d"]["headline"]["pipe"]["n"] == n_test
    assert "## Phase D: phase_d" in (wd.root / "report.md").read_text()
    # every server ended with the experiment
    assert sorted(e[1] for e in node.events if e[0] == "stop") == ["pi1-pipe", "pi1-sft", "pi2-sft"]

    # a rerun skips every part whose result exists: nothing is launched or served again
    before, rl = len(node.events), dict(parts["rl"])
    manifest = exp.run()
    assert [e for e in node.events[before:] if e[0] in ("launch", "phase", "control", "preflight")] == []
    assert manifest["parts"]["rl"] == rl and manifest["parts"]["choose"]["status"] == "ok"  # skipped: its time kept


def test_pi1_on_two_gpus_each_arm_its_own_and_no_stagger(node: Node, tmp_path: Path) -> None:
    experiment(node, tmp_path, gpus=("0", "1"), control="off").run()
    assert [(r.phase.name, r.gpus) for r in node.runs] == [
        ("a1", ("0",)),
        ("a2", ("1",)),
        ("b1", ("0",)),
        ("c1", ("1",)),
    ]
    assert node.sleeps == []
    launched = [e for e in node.events if e[0] == "launch"]
    assert launched == [("launch", "pi1-sft", "0"), ("launch", "pi2-sft", "1"), ("launch", "pi1-local", "0"),
                        ("launch", "pi1-pipe", "1")]  # fmt: skip


def test_cpu_arms_in_turn_and_executors_stopped_for_grpo(node: Node, tmp_path: Path) -> None:
    experiment(node, tmp_path, profile="cpu-smoke", control="off").run()
    phases = [e for e in node.events if e[0] == "phase"]
    assert phases == [("phase", p, "cpu") for p in ("a1", "a2", "b1", "c1")] and node.sleeps == []
    rl_at = node.events.index(("phase", "b1", "cpu"))
    up_during_rl: set[str] = set()
    for e in node.events[:rl_at]:
        if e[0] == "launch":
            up_during_rl.add(e[1])
        elif e[0] == "stop":
            up_during_rl.discard(e[1])
    assert up_during_rl == {"pi2-sft"}  # only the pipeline reward's π2ˢ beside GRPO
    assert ("reward_api", "pipe", "pi2-sft", "1") in node.events


def test_no_headroom_stops_before_rl_unless_forced(node: Node, tmp_path: Path) -> None:
    exp = experiment(node, tmp_path, gpus=("0",))
    exp.cfg.temps = (1.0,)
    with pytest.raises(ExperimentStopped, match=r"no headroom: b1, c1"):
        exp.run()
    assert [r.phase.name for r in node.runs] == ["a1", "a2"]
    exp.cfg.force_rl = True
    exp.cfg.control = "off"
    exp.run()
    assert [r.phase.name for r in node.runs] == ["a1", "a2", "b1", "c1"]


def test_a_failed_serial_control_stops_also_on_a_rerun(node: Node, tmp_path: Path) -> None:
    node.control_passes = False
    exp = experiment(node, tmp_path, gpus=("0",))
    with pytest.raises(ExperimentStopped, match="FAILED"):
        exp.run()
    with pytest.raises(ExperimentStopped, match="FAILED"):
        exp.run()
    assert [r.phase.name for r in node.runs] == ["a1", "a2"]


def test_pi2_c2data_gold_schemas_and_the_improvable_fallback(node: Node, tmp_path: Path) -> None:
    exp = experiment(node, tmp_path, "pi2-ab", gpus=("0", "1"), control="parallel", rl_improvable=True,
                     c2_train_prompts=7)  # fmt: skip
    exp.run()
    # the preflight's π2ˢ on arm A's GPU and c2data's π1ˢ on arm B's start together; eval keeps both
    launched = [e for e in node.events if e[0] == "launch"]
    assert launched[:2] == [("launch", "pi2-sft", "0"), ("launch", "pi1-sft", "1")]
    assert [e[1] for e in launched[2:]] == ["pi2-local", "pi2-pipe"]
    assert ("c2data", "pi1-sft", "7", "") in node.events
    # 12 improvable prompts do not fill the gpu profile's batch of 64: B2 trains on the train split
    b2 = next(r for r in node.runs if r.phase.name == "b2")
    assert not any(o.startswith("data.train_files=") for o in b2.overrides)
    assert node.sleeps == [150.0]  # RL after the parallel control
    assert node.served["local"] == ["http://pi1-sft", "http://pi2-local"]
    assert (exp.wd.gold_schema_eval / "metrics.json").is_file() and (exp.wd.phase_d / "metrics.json").is_file()


def allocation_ends_during_pipes_stage2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``pipe`` setting's Stage 2 fails as an allocation ending mid-Phase D would (the node's fake runner's
    ``run_two_stage``, wrapped)."""
    import trainer.evaluation.two_stage as two_stage

    whole = two_stage.run_two_stage

    def cut(setting: str, *args: Any, **kw: Any) -> Any:
        if setting == "pipe":
            raise RuntimeError("the allocation ended")
        return whole(setting, *args, **kw)

    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", cut)


def test_pi2_gold_schema_eval_is_written_before_phase_d_ends(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """π2 on gold schemas (one stage) lands before Phase D (two): a run cut during Phase D keeps it."""
    allocation_ends_during_pipes_stage2(monkeypatch)
    exp = experiment(node, tmp_path, "pi2-ab", gpus=("0", "1"), control="off")
    with pytest.raises(RuntimeError, match="the allocation ended"):
        exp.run()
    gold = json.loads((exp.wd.gold_schema_eval / "metrics.json").read_text())
    assert set(gold["settings"]) == {"sft", "local", "pipe"}
    assert not (exp.wd.phase_d / "metrics.json").exists()
    assert exp.ctx.record.data["parts"]["eval"]["status"] == "failed"


def test_pi1_schemas_alone_are_scored_before_phase_d_ends(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pi1-ab: the three π1s' schemas (one stage: the B1 target) land before Phase D (two); a run cut
    during Phase D keeps them, and each setting's scores are its own π1's."""
    allocation_ends_during_pipes_stage2(monkeypatch)
    exp = experiment(node, tmp_path, gpus=("0", "1"), control="off")
    with pytest.raises(RuntimeError, match="the allocation ended"):
        exp.run()
    stage1 = json.loads((exp.wd.stage1_eval / "metrics.json").read_text())
    assert list(stage1["settings"]) == ["sft", "local", "pipe"]
    assert all(
        m["macro"]["schema_f1"] == 1.0 and "aligned_cell_f1" not in m["macro"] for m in stage1["settings"].values()
    )
    assert not (exp.wd.phase_d / "metrics.json").exists() and not exp.wd.gold_schema_eval.exists()
    assert exp.ctx.record.data["parts"]["eval"]["status"] == "failed"


def test_a_rerun_after_a_cut_eval_takes_pi1s_schemas_from_the_first(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eval cut during Phase D (pipe's Stage 2) keeps its finished Stage 1: the rerun scores the same
    schemas without running π1 again, and finishes Phase D."""
    import trainer.evaluation.two_stage as two_stage

    whole, cut = two_stage.run_two_stage, {"on": True}

    def maybe_cut(setting: str, *args: Any, **kw: Any) -> Any:
        if setting == "pipe" and cut["on"]:
            raise RuntimeError("the allocation ended")
        return whole(setting, *args, **kw)

    monkeypatch.setattr("trainer.evaluation.two_stage.run_two_stage", maybe_cut)
    exp = experiment(node, tmp_path, gpus=("0", "1"), control="off")
    with pytest.raises(RuntimeError, match="the allocation ended"):
        exp.run()
    first = sorted(node.stage1)
    assert len(first) == 3 and len(list(exp.wd.stage1_cache.glob("*.json"))) == 3
    cut["on"] = False
    again = experiment(node, tmp_path, gpus=("0", "1"), control="off")
    again.run()
    assert sorted(node.stage1) == first  # no Stage 1 ran again
    assert (again.wd.phase_d / "metrics.json").is_file()


def test_settings_that_share_a_pi1_share_one_stage1(node: Node, tmp_path: Path) -> None:
    """pi2-ab: sft, local and pipe all take π1ˢ: one Stage 1, so every setting gets the same schemas and the
    π2 comparison carries no Stage-1 noise; pi1-ab's three π1s each run their own."""
    exp = experiment(node, tmp_path, "pi2-ab", gpus=("0", "1"), control="off")
    exp.run()
    assert node.stage1 == ["http://pi1-sft"]
    assert {name: node.served[name] for name in ("sft", "local", "pipe")} == {
        "sft": ["http://pi1-sft", "http://pi2-sft"],
        "local": ["http://pi1-sft", "http://pi2-local"],
        "pipe": ["http://pi1-sft", "http://pi2-pipe"],
    }
    records = {
        name: [json.loads(line) for line in (exp.wd.phase_d / f"predictions_{name}.jsonl").read_text().splitlines()]
        for name in ("sft", "local", "pipe")
    }
    schemas = {name: [r["schema_prediction"] for r in recs] for name, recs in records.items()}
    assert schemas["sft"] == schemas["local"] == schemas["pipe"] and schemas["sft"]
    for name, recs in records.items():  # each setting's records are still its own
        assert {(r["setting"], r["schema_model"]) for r in recs} == {(name, exp.ctx.output(exp.wd.phase("a1")))}

    node.stage1.clear()
    experiment(node, tmp_path, gpus=("0", "1"), control="off").run()
    assert sorted(node.stage1) == ["http://pi1-local", "http://pi1-pipe", "http://pi1-sft"]


def test_preflight_sources_narrow_the_sweep_and_the_improvable_set(node: Node, tmp_path: Path) -> None:
    """--preflight-sources: only those sources are sampled, so the improvable set holds only their prompts."""
    exp = experiment(node, tmp_path, profile="cpu-smoke", control="off", preflight_sources=("people",))
    exp.run()
    assert node.preflight_sources and set(node.preflight_sources) == {("people",)}
    rows = pq.read_table(exp.wd.improvable("b1")).column("extra_info").to_pylist()
    assert rows and {source_of(r["id"]) for r in rows} == {"people"}
    experiment(node, tmp_path, "pi2-ab", profile="cpu-smoke", control="off").run()
    assert node.preflight_sources[-1] is None  # by default every source


def test_rl_improvable_trains_on_the_set_where_it_fills_a_batch(node: Node, tmp_path: Path) -> None:
    experiment(node, tmp_path, profile="cpu-smoke", control="off", rl_improvable=True).run()
    b1 = next(r for r in node.runs if r.phase.name == "b1")
    assert f"data.train_files={tmp_path / 'pi1-ab' / 'preflight' / 'b1_improvable.parquet'}" in b1.overrides


def test_sft_from_links_a_finished_experiment_and_refuses_an_unfinished_one(node: Node, tmp_path: Path) -> None:
    experiment(node, tmp_path, gpus=("0",), control="off", data_phases=("a1", "a2", "b1", "c1", "b2")).run()
    other = experiment(node, tmp_path, "pi2-ab", gpus=("0",), control="off", sft_from=tmp_path / "pi1-ab")
    n_sft = sum(r.phase.name in ("a1", "a2") for r in node.runs)
    other.run()
    assert sum(r.phase.name in ("a1", "a2") for r in node.runs) == n_sft  # no SFT again
    assert (other.wd.root / "a1").resolve() == (tmp_path / "pi1-ab" / "a1").resolve()
    bare = experiment(node, tmp_path, "pi2-ab", gpus=("0",), sft_from=tmp_path / "nothing")
    with pytest.raises(ExperimentStopped, match="not finished or not built: a1, a2"):
        bare.run()


def test_a_rerun_reuses_phases_only_when_trained_from_the_same_inputs(node: Node, tmp_path: Path) -> None:
    """The rule every recipe shares (trainer.runs.reuse): a finished phase is reused for the same inputs, on
    any GPUs (the placement is no input); a rerun with other settings stops, naming the phase and the
    difference, before anything is launched."""
    experiment(node, tmp_path, gpus=("0",), control="off", rl_steps=3).run()
    n = len(node.runs)
    assert all((tmp_path / "pi1-ab" / p / PHASE_INPUTS).is_file() for p in ("a1", "a2", "b1", "c1"))
    experiment(node, tmp_path, gpus=("0", "1"), control="off", rl_steps=3).run()  # two GPUs: other placement
    assert len(node.runs) == n
    steps = r"phase b1: .*other inputs \(overrides: recorded .*total_training_steps=3"
    with pytest.raises(StaleResultError, match=steps):
        experiment(node, tmp_path, gpus=("0",), control="off", rl_steps=4).run()
    with pytest.raises(StaleResultError, match=r"phase a1: .*other inputs \(overrides: recorded \[\], now \['x=1'\]"):
        experiment(node, tmp_path, gpus=("0",), control="off", rl_steps=3, sft_overrides=("x=1",)).run()
    # C1 learned from the frozen π2ˢ behind its pipeline reward: another π2ˢ (A2's export replaced) is another input
    c1 = next(r for r in node.runs if r.phase.name == "c1")
    a2 = tmp_path / "pi1-ab" / "a2" / "hf"
    assert c1.reward_model == str(a2) and next(r for r in node.runs if r.phase.name == "b1").reward_model is None
    (a2 / "model.safetensors").write_bytes(b"another pi2")
    with pytest.raises(StaleResultError, match=r"phase c1: .*other inputs \(reward_model: recorded "):
        experiment(node, tmp_path, gpus=("0",), control="off", rl_steps=3).run()
    assert len(node.runs) == n  # nothing launched


def test_pi1_on_four_gpus_two_per_arm(node: Node, tmp_path: Path) -> None:
    experiment(node, tmp_path, gpus=("0", "1", "2", "3"), control="off").run()
    assert [(r.phase.name, r.gpus, r.nproc) for r in node.runs] == [
        ("a1", ("0",), 1), ("a2", ("2",), 1), ("b1", ("0", "1"), 2), ("c1", ("2", "3"), 2)
    ]  # fmt: skip  (SFT: one GPU per arm, placement.py says why)
    b1 = next(r for r in node.runs if r.phase.name == "b1")
    assert "trainer.n_gpus_per_node=2" in b1.overrides and node.sleeps == []
    # executors on each arm's first GPU; the two that start together are on different GPUs
    launched = [e for e in node.events if e[0] == "launch"]
    assert launched == [("launch", "pi1-sft", "0"), ("launch", "pi2-sft", "2"), ("launch", "pi1-local", "0"),
                        ("launch", "pi1-pipe", "2")]  # fmt: skip


def test_rl_sources_train_each_arm_on_those_sources_and_validate_on_all(node: Node, tmp_path: Path) -> None:
    """--rl-sources: c2data draws C2's documents from them, each arm trains on its train split of them (the
    improvable set is too small here: 12 prompts against a batch of 64), validation files stay whole."""
    exp = experiment(node, tmp_path, "pi2-ab", gpus=("0", "1"), control="off", rl_improvable=True,
                     rl_sources=("people", "product"), c2_train_prompts=7)  # fmt: skip
    manifest = exp.run()
    assert ("c2data", "pi1-sft", "7", "people,product") in node.events
    for arm in ("b2", "c2"):
        run = next(r for r in node.runs if r.phase.name == arm)
        train = exp.wd.source_set(arm, ("people", "product"))
        assert f"data.train_files={train}" in run.overrides
        assert not any(o.startswith("data.val_files=") for o in run.overrides)
        ids = [r["id"] for r in pq.read_table(train).column("extra_info").to_pylist()]
        assert len(ids) == 8 and {source_of(i) for i in ids} == {"people", "product"}
        assert manifest[f"train_set:{arm}"] == {"sources": ["people", "product"], "prompts": 8, "path": str(train)}


def test_rl_sources_narrow_an_improvable_set_that_fills_a_batch(node: Node, tmp_path: Path) -> None:
    exp = experiment(node, tmp_path, profile="cpu-smoke", control="off", rl_improvable=True, rl_sources=("people",))
    exp.run()
    b1 = next(r for r in node.runs if r.phase.name == "b1")
    assert f"data.train_files={exp.wd.improvable('b1')}" in b1.overrides  # the set wins where it fills a batch
    rows = pq.read_table(exp.wd.improvable("b1")).column("extra_info").to_pylist()
    assert rows and {source_of(r["id"]) for r in rows} == {"people"}


def test_rl_sources_without_a_document_there_stop_before_training(node: Node, tmp_path: Path) -> None:
    exp = experiment(node, tmp_path, profile="cpu-smoke", control="off", rl_sources=("wikitabletext",))
    with pytest.raises(ValueError, match=r"no prompt of source\(s\) \['wikitabletext'\] \(it has \['invoice', "):
        exp.run()
    assert [r.phase.name for r in node.runs] == ["a1", "a2"]


def test_rl_mix_share_adds_the_other_sources_to_b2s_set_and_refuses_another_share(node: Node, tmp_path: Path) -> None:
    """--rl-mix-share: B2 trains on its people prompts with invoice and product added evenly to make the share,
    recorded in the run record; C2's split holds only people documents (c2data drew them) and is not mixed; a
    rerun with another share refuses the arm trained on the first (its train set by content)."""
    from collections import Counter

    kw: dict[str, Any] = {"gpus": ("0", "1"), "control": "off", "rl_sources": ("people",)}
    exp = experiment(node, tmp_path, "pi2-ab", rl_mix_share=0.5, **kw)
    manifest = exp.run()
    b2, c2 = (next(r for r in node.runs if r.phase.name == arm) for arm in ("b2", "c2"))
    mixed = exp.wd.train_sets / "b2_people+mix.parquet"
    assert f"data.train_files={mixed}" in b2.overrides
    ids = [r["id"] for r in pq.read_table(mixed).column("extra_info").to_pylist()]
    assert Counter(source_of(i) for i in ids) == {"people": 4, "invoice": 2, "product": 2}
    record = manifest["train_mix:b2"]
    assert (record["share"], record["seed"], record["drawn"]) == (0.5, 0, {"invoice": 2, "product": 2})
    assert f"data.train_files={exp.wd.source_set('c2', ('people',))}" in c2.overrides
    assert "train_mix:c2" not in manifest
    again = experiment(node, tmp_path, "pi2-ab", rl_mix_share=0.2, **kw)
    with pytest.raises(StaleResultError, match=r"phase b2: .*other inputs \(train_files: recorded '[0-9a-f]{64}'"):
        again.run()  # B2 finished on the 0.5 mix: another share is another train set, by content
    n = len(node.runs)
    for arm in ("b2", "c2"):  # the arms cut short: the rerun trains them again, B2 on the 0.2 mix
        (exp.wd.phase(arm) / "phase_result.json").unlink()
    manifest = experiment(node, tmp_path, "pi2-ab", rl_mix_share=0.2, **kw).run()
    assert [r.phase.name for r in node.runs[n:]] == ["b2", "c2"] and manifest["train_mix:b2"]["share"] == 0.2


def test_rl_mix_share_without_a_chosen_set_stops_before_training(node: Node, tmp_path: Path) -> None:
    """--rl-improvable alone, and the improvable set does not fill a batch: the arm would train on its whole
    train split, which has no other source to draw from."""
    from trainer.data.train_mix import TrainMixError

    exp = experiment(node, tmp_path, "pi2-ab", gpus=("0", "1"), control="off", rl_improvable=True, rl_mix_share=0.2)
    with pytest.raises(TrainMixError, match=r"--rl-mix-share: 0.2: b2 trains on its whole train split"):
        exp.run()
    assert sorted(r.phase.name for r in node.runs) == ["a1", "a2"]


def test_the_preflight_draws_from_the_documents_the_data_build_kept(node: Node, tmp_path: Path) -> None:
    """--limit N builds the train split from the first N documents: the preflight samples those, so every
    improvable id is a prompt of the arm's train split (else choose fails: none of the ids is in the file)."""
    exp = experiment(node, tmp_path, profile="cpu-smoke", control="off", rl_improvable=True, limit=6)
    exp.run()
    assert set(node.preflight_limits) == {6}
    kept = {ex.id for ex in read_golden(SAMPLE / "common_train_schemas.jsonl", 6)}
    rows = pq.read_table(exp.wd.improvable("b1")).column("extra_info").to_pylist()
    assert rows and {r["id"] for r in rows} <= kept

"""The two per-sample costs taken off VERL's rollout path: the patch lands where VERL's agent-loop module is
imported, the in-process reward equals VERL's reward-loop worker, and the reused agent loop is VERL's own."""

from __future__ import annotations

import asyncio
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.trainer.in_verl.verl_harness import compose_ppo_config, rollout_dataproto, run_reward_worker
from trainer.in_verl import agent_loop_speed as speed
from trainer.phases.launch import ALWAYS_LOADED, CONFIG_DIR

REPO = Path(__file__).resolve().parents[3]


def test_the_module_is_loaded_in_every_verl_process() -> None:
    assert speed.MODULE in ALWAYS_LOADED


def test_grpo_phases_turn_both_on_and_a_config_without_the_key_keeps_verls_path() -> None:
    base = OmegaConf.load(CONFIG_DIR / "grpo_base.yaml")
    assert speed.settings_of(base) == (True, True)
    assert speed.settings_of(OmegaConf.create({"reward": {}})) == (False, False)
    off = OmegaConf.create({speed.CONFIG_KEY: {"reuse_single_turn": False, "reward_in_process": True}})
    assert speed.settings_of(off) == (False, True)


def test_in_process_reward_only_for_a_custom_function_without_a_reward_model() -> None:
    def cfg(path: str | None, model: bool) -> Any:
        return OmegaConf.create(
            {"reward": {"custom_reward_function": {"path": path}, "reward_model": {"enable": model}}}
        )

    assert speed.reward_in_process_allowed(cfg("/r.py", False))
    assert not speed.reward_in_process_allowed(cfg(None, False))  # VERL's rule-based default
    assert not speed.reward_in_process_allowed(cfg("/r.py", True))  # a reward model needs VERL's worker


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.mark.verl
def test_the_patch_lands_when_verl_imports_its_agent_loop_and_not_before() -> None:
    code = f"""
        import os, sys
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "{speed.MODULE}"
        import verl
        assert "{speed.AGENT_LOOP_MODULE}" not in sys.modules, "imported eagerly"
        from verl.experimental.agent_loop import AgentLoopWorker
        from verl.trainer.ppo.v1 import agent_loop_tq
        assert getattr(AgentLoopWorker, "{speed._PATCHED}", False)
        assert issubclass(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__, AgentLoopWorker)
        print("patched")
    """
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "patched" in done.stdout
    plain = _run(f"""
        from verl.experimental.agent_loop import AgentLoopWorker
        assert not hasattr(AgentLoopWorker, "{speed._PATCHED}")
    """)
    assert plain.returncode == 0, plain.stderr[-3000:]


@pytest.mark.verl
def test_verls_single_turn_loop_keeps_no_state_between_samples() -> None:
    """The reuse holds only while ``run`` assigns nothing to ``self`` (a VERL upgrade that does fails here)."""
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    assert f"{SingleTurnAgentLoop.__module__}.{SingleTurnAgentLoop.__qualname__}" == speed.SINGLE_TURN_TARGET
    source = inspect.getsource(SingleTurnAgentLoop.run)
    assert not re.findall(r"self\.\w+(\[[^\]]*\])?\s*(=|\+=|-=)(?!=)", source)


@pytest.mark.verl
def test_the_single_turn_loop_is_built_once_per_worker_and_tool_loops_are_not_reused(
    default_model_dir: Path,
) -> None:
    import verl.experimental.agent_loop.agent_loop as module
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils import hf_tokenizer

    registry = module._agent_loop_registry
    assert speed.reusable(registry, "single_turn_agent")
    assert "tool_agent" in registry and not speed.reusable(registry, "tool_agent")
    assert not speed.reusable(registry, "no_such_agent")

    config = compose_ppo_config(default_model_dir)
    worker = module.AgentLoopWorker.__new__(module.AgentLoopWorker)  # the attributes the builder reads
    worker.config, worker.llm_client, worker.processor, worker.tools = config, None, None, []
    worker.tokenizer = hf_tokenizer(str(default_model_dir))
    worker.hf_model_type, worker.dataset_cls = "llama", None
    first = speed.agent_loop_of(worker, module, "single_turn_agent")
    assert isinstance(first, SingleTurnAgentLoop)
    assert isinstance(first.continuous_token_builder, speed.CachedPromptTokens)
    assert speed.agent_loop_of(worker, module, "single_turn_agent") is first
    other = module.AgentLoopWorker.__new__(module.AgentLoopWorker)
    other.__dict__.update({k: v for k, v in worker.__dict__.items() if k != "_stx_agent_loops"})
    assert speed.agent_loop_of(other, module, "single_turn_agent") is not first


@pytest.mark.verl
def test_the_in_process_reward_equals_verls_reward_loop_worker(default_model_dir: Path, tmp_path: Path) -> None:
    fn = tmp_path / "reward.py"
    fn.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    return {'score': len(solution_str) / 100.0, 'source_len': float(len(data_source))}\n"
    )
    reward = [f"reward.custom_reward_function.path={fn}", "reward.custom_reward_function.name=compute_score"]
    cfg = compose_ppo_config(default_model_dir, reward)
    from verl.utils import hf_tokenizer

    tok = hf_tokenizer(str(default_model_dir))
    prompt = [{"role": "user", "content": "Extract the table."}]
    samples = [
        {"prompt": prompt, "response": text, "data_source": src, "ground_truth": "{}"}
        for text, src in (("a", "e2e"), ('{"name": "x"}', "wikitabletext"), ("", "rotowire"))
    ]
    data = rollout_dataproto(tok, samples, prompt_len=64, resp_len=32)
    expected = run_reward_worker(cfg, data)

    handle = speed.InProcessRewardHandle(cfg)

    async def in_process() -> list[Any]:
        return [await handle.compute_score.remote(data[i : i + 1]) for i in range(len(data))]

    got = asyncio.run(in_process())
    assert got == expected
    assert handle.calls == 3
    assert [g["reward_score"] for g in got] == [0.01, 0.13, 0.0]


@pytest.mark.verl
def test_a_prompt_is_rendered_once_per_worker_with_the_builders_own_tokens(default_model_dir: Path) -> None:
    from verl.utils import hf_tokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tok = hf_tokenizer(str(default_model_dir))
    builder = create_continuous_token_builder(tok, hf_model_type="llama")
    cached = speed.CachedPromptTokens(builder)
    a = [{"role": "system", "content": "Write the schema."}, {"role": "user", "content": "Name: Ada. Born 1815."}]
    b = [{"role": "user", "content": "Name: Alan. Born 1912."}]
    first = cached.build_initial_tokens(a)
    assert first == builder.build_initial_tokens(a) and len(first) > 10
    first.append(-1)  # a caller's change to its copy reaches no other sample
    for _ in range(15):
        assert cached.build_initial_tokens(a) == builder.build_initial_tokens(a)
    assert cached.build_initial_tokens(b) == builder.build_initial_tokens(b) != builder.build_initial_tokens(a)
    assert (cached.renders, cached.hits) == (2, 15)
    assert cached.tokenizer is builder.tokenizer  # the rest is the builder's own


def test_token_only_outputs_are_asked_of_vllm_rollouts_only() -> None:
    base = OmegaConf.load(CONFIG_DIR / "grpo_base.yaml")
    assert speed.token_only_of(base)
    sglang = OmegaConf.merge(base, {"actor_rollout_ref": {"rollout": {"name": "sglang"}}})
    assert not speed.token_only_of(sglang)  # VERL's SGLang server takes no detokenize parameter
    off = OmegaConf.merge(base, {speed.CONFIG_KEY: {"token_only_outputs": False}})
    assert not speed.token_only_of(off) and not speed.token_only_of(OmegaConf.create({}))
    shared = {"temperature": 1.0, "logprobs": True}
    assert speed.token_only(shared) == {"temperature": 1.0, "logprobs": True, "detokenize": False}
    assert "detokenize" not in shared  # the samples of a batch share the caller's dict


class _GenerateFailsAfterRecording(Exception):
    """Raised by the rollout server stand-in once it has seen a request: the fault that ends the sample."""


class _ServerThatRecordsThenFails:
    def __init__(self) -> None:
        self.sampling_params: list[dict[str, Any]] = []

    async def generate(self, *, sampling_params: dict[str, Any], **_: Any) -> Any:
        self.sampling_params.append(dict(sampling_params))
        raise _GenerateFailsAfterRecording


@pytest.mark.verl
@pytest.mark.parametrize("token_only", [True, False])
def test_a_sample_reaches_the_rollout_server_with_tokens_only_when_set(
    default_model_dir: Path, token_only: bool
) -> None:
    """Through VERL's own AgentLoopWorker (patched) and single-turn loop, the request's sampling parameters
    carry detokenize=False under the setting and are VERL's own without it; the worker's shared dict is untouched."""
    import verl.experimental.agent_loop.agent_loop as module
    from verl.utils import hf_tokenizer

    config = compose_ppo_config(default_model_dir)
    server = _ServerThatRecordsThenFails()
    worker = module.AgentLoopWorker.__new__(module.AgentLoopWorker)
    worker.config, worker.llm_client, worker.processor, worker.tools = config, server, None, []
    worker.tokenizer = hf_tokenizer(str(default_model_dir))
    worker.hf_model_type, worker.dataset_cls = "llama", None
    worker._stx_reuse_single_turn, worker._stx_token_only = True, token_only
    shared = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    trajectory = {"step": 0, "sample_index": 0, "rollout_n": 0, "validate": False}
    with pytest.raises(_GenerateFailsAfterRecording):
        asyncio.run(
            worker._run_agent_loop(
                shared, trajectory, agent_name="single_turn_agent", trace=False,
                raw_prompt=[{"role": "user", "content": "Name: Ada. Born 1815."}],
            )
        )  # fmt: skip
    (sent,) = server.sampling_params
    assert sent == ({**shared, "detokenize": False} if token_only else shared)
    assert "detokenize" not in shared

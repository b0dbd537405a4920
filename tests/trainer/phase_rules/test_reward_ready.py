"""The trainer's wait for its reward API (trainer/phase_rules/reward_ready.py), against real reward API processes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from services.executor_vllm.vllm_server import free_port
from services.reward_api.process import RewardApiProcess
from tests.helpers.faulty_executor import closed_port
from trainer.in_verl.phase_trainer import wait_for_reward_api_of
from trainer.phase_rules.reward_ready import READY_FILE, RewardApiNotReadyError, check_once, wait_for_reward_api
from trainer.serving.endpoint import Endpoint
from trainer.serving.reward_api import reward_api_process


@pytest.mark.service
def test_wait_returns_once_an_api_started_later_answers(tmp_path: Path) -> None:
    port = free_port()
    api = RewardApiProcess({}, port=port, log_path=tmp_path / "api.log")
    url = f"http://127.0.0.1:{port}"
    assert not check_once(url, pipeline=False).ready  # nothing listens yet
    done = threading.Event()

    def start_late() -> None:  # the thread lives on while the API runs (its children die with their thread)
        time.sleep(3.0)
        with api:
            done.wait()

    starter = threading.Thread(target=start_late)
    starter.start()
    try:
        waited = wait_for_reward_api(url, pipeline=False, timeout_s=120, poll_s=0.2)
        assert waited >= 2.5  # it waited for the API, which came up after 3 s
        assert check_once(url, pipeline=False).ready
    finally:
        done.set()
        starter.join()


@pytest.mark.service
def test_pipeline_phase_needs_an_executor(tmp_path: Path) -> None:
    with reward_api_process(tmp_path / "plain.log") as api:
        assert wait_for_reward_api(api.url, pipeline=False, timeout_s=5) < 1.0
        start = time.monotonic()
        with pytest.raises(RewardApiNotReadyError, match=r"will not become ready: .*executor not configured"):
            wait_for_reward_api(api.url, pipeline=True, timeout_s=60)
        assert time.monotonic() - start < 10  # final at once, not after the deadline
    # an executor that does not answer: not ready until the deadline, which names what was missing
    dead = Endpoint("http://127.0.0.1:9", "pi2")
    missing = r"not ready after 2 s \(last: /readyz/pipeline: HTTP 503"
    with (
        reward_api_process(tmp_path / "dead.log", executors=[dead]) as api,
        pytest.raises(RewardApiNotReadyError, match=missing),
    ):
        wait_for_reward_api(api.url, pipeline=True, timeout_s=2, poll_s=0.2)


def test_abort_file_stops_the_wait_with_its_cause(tmp_path: Path) -> None:
    abort = tmp_path / "reward_api_failed.txt"
    threading.Timer(1.0, abort.write_text, args=("executor pi2: exit 1 before it listed its model",)).start()
    start = time.monotonic()
    why = "services failed to start: executor pi2: exit 1"
    with closed_port() as port, pytest.raises(RewardApiNotReadyError, match=why):  # nothing will ever listen
        wait_for_reward_api(f"http://127.0.0.1:{port}", pipeline=True, timeout_s=120, abort_file=abort, poll_s=0.2)
    assert time.monotonic() - start < 10


def test_timeout_names_the_url_and_what_did_not_answer() -> None:
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(
            RewardApiNotReadyError, match=rf"{url} not ready after 1 s \(last: /healthz: ConnectError\)"
        ):
            wait_for_reward_api(url, pipeline=False, timeout_s=1, poll_s=0.2)


@pytest.mark.service
def test_phase_config_decides_what_is_waited_for(tmp_path: Path) -> None:
    with reward_api_process(tmp_path / "plain.log") as api:

        def cfg(phase: str) -> object:
            return OmegaConf.create(
                {
                    "phase": {"name": phase},
                    "reward": {"custom_reward_function": {"reward_kwargs": {"url": api.url}}},
                    "reward_ready": {"timeout_s": 30, "abort_file": str(tmp_path / "none.txt")},
                    "trainer": {"default_local_dir": str(tmp_path / "ckpt")},
                }
            )

        off = cfg("c1")
        off.reward_ready.wait = False  # type: ignore[attr-defined]
        assert wait_for_reward_api_of(off) == 0.0  # no wait at all (not even for the missing executor)
        assert wait_for_reward_api_of(cfg("b1")) < 1.0  # schema reward: /healthz is enough
        record = json.loads((tmp_path / "ckpt" / READY_FILE).read_text())  # what the start-up report reads
        assert record["pipeline"] is False and record["waited_s"] < 1.0 and record["url"] == api.url
        assert abs(record["ready_at_unix"] - time.time()) < 30
        with pytest.raises(RewardApiNotReadyError, match="executor not configured"):
            wait_for_reward_api_of(cfg("c1"))  # pipeline reward: an executor must serve π2

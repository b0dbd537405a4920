"""One deadline budget (docs/reliability.md, "Deadline budget"): the executor's attempts fit inside the reward
service's request deadline, the service's answer inside the trainer client's deadline, and the table in the docs
states the defaults the code has."""

from __future__ import annotations

from pathlib import Path

import yaml

from services.reward_api.settings import Settings
from trainer.in_verl.reward_batcher import RewardClientConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
SCORING_MARGIN_S = 30.0  # scoring a request's items after its executor phase, and the network


def defaults() -> dict[str, float]:
    s = Settings.model_fields
    c = RewardClientConfig.model_fields
    return {
        "executor_timeout_s": float(s["executor_timeout_s"].default),
        "retries": float(s["retries"].default),
        "retry_backoff_s": float(s["retry_backoff_s"].default),
        "request_deadline_s": float(s["request_deadline_s"].default),
        "queue_timeout_s": float(s["queue_timeout_s"].default),
        "body_timeout_s": float(s["body_timeout_s"].default),
        "client_timeout_s": float(c["timeout_s"].default),
    }


def executor_phase_worst_s(d: dict[str, float]) -> float:
    """Attempts × timeout, plus tenacity's ``wait_exponential_jitter`` waits: ``initial·2^k + jitter`` each."""
    attempts = int(d["retries"]) + 1
    waits = sum(d["retry_backoff_s"] * 2**k + d["retry_backoff_s"] for k in range(attempts - 1))
    return attempts * d["executor_timeout_s"] + waits


def test_each_deadline_fits_inside_the_next_one_out() -> None:
    d = defaults()
    assert executor_phase_worst_s(d) <= d["request_deadline_s"]
    service_worst = d["queue_timeout_s"] + d["body_timeout_s"] + d["request_deadline_s"] + SCORING_MARGIN_S
    assert service_worst < d["client_timeout_s"], "the client would give up before the service's own answer"
    assert RewardClientConfig.model_fields["attempt_timeout_s"].default is None  # one attempt may take it all


def test_the_phase_configs_leave_the_clients_deadline_to_the_code() -> None:
    """A second default in the YAML (300 s there, 120 s in the code) made the service's 300-s deadline and the
    client's expire together."""
    configs = sorted((Path(__file__).resolve().parents[1] / "trainer" / "phases" / "configs").rglob("*.yaml"))
    assert configs
    for path in configs:
        cfg = yaml.safe_load(path.read_text()) or {}
        kwargs = ((cfg.get("reward") or {}).get("custom_reward_function") or {}).get("reward_kwargs") or {}
        assert not {"timeout_s", "timeout"} & set(kwargs), path


def test_the_docs_table_states_the_code_defaults() -> None:
    text = DOC.read_text()
    table = text.split("## Deadline budget", 1)[1].split("\n## ", 1)[0]
    d = defaults()
    rows = {
        "`REWARD_API_EXECUTOR_TIMEOUT_S`": f"{d['executor_timeout_s']:g} s",
        "`REWARD_API_REQUEST_DEADLINE_S`": f"{d['request_deadline_s']:g} s",
        "`reward_kwargs.timeout_s`": f"{d['client_timeout_s']:g} s",
        "`REWARD_API_QUEUE_TIMEOUT_S`, `REWARD_API_BODY_TIMEOUT_S`": (
            f"{d['queue_timeout_s']:g} s, {d['body_timeout_s']:g} s"
        ),
        "`REWARD_API_RETRIES` + 1": f"{int(d['retries']) + 1}, {d['retry_backoff_s']:g} s",
    }
    for setting, value in rows.items():
        line = next((ln for ln in table.splitlines() if setting in ln), "")
        assert f"| {value} |" in line, (setting, value, line)
    assert f"{int(d['retries']) + 1} × {d['executor_timeout_s']:g} + 2.5 = {executor_phase_worst_s(d):g} s" in table

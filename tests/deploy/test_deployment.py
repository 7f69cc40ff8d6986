"""The server's Deployment, PDB, Service and priority classes."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

import deploy_tree
from deploy_tree import NAMESPACE, REPO

BASE = deploy_tree.base()
DEPLOYMENT = deploy_tree.one("Deployment", "gpu-admission", docs=BASE)
POD = DEPLOYMENT["spec"]["template"]["spec"]
(SERVER,) = POD["containers"]
SHUTDOWN_DEFAULT = 15
TLS_DIR = "/etc/gpu-admission/tls"
POLICIES_DIR = "/etc/gpu-admission/policies"


def _args(container: dict[str, Any]) -> dict[str, str]:
    """--flag value pairs of a container's args (also --flag=value)."""
    args, pairs = list(container.get("args", [])), {}
    while args:
        flag = args.pop(0)
        assert flag.startswith("--"), flag
        if "=" in flag:
            flag, value = flag.split("=", 1)
        elif args and not args[0].startswith("--"):
            value = args.pop(0)
        else:
            value = ""
        pairs[flag] = value
    return pairs


def _effective(field: str, container: dict[str, Any], pod: dict[str, Any]) -> Any:
    """A security setting as the kubelet applies it: container over pod."""
    return container.get("securityContext", {}).get(
        field, pod.get("securityContext", {}).get(field))


def _pod_specs() -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for doc in deploy_tree.manifests():
        spec = deploy_tree.pod_template(doc.body)
        if spec is not None:
            specs.append((doc.where, spec))
    return specs


POD_SPECS = _pod_specs()


def test_server_arguments_use_the_mounted_paths() -> None:
    args = _args(SERVER)
    assert args["--policies"] == POLICIES_DIR
    assert args["--tls-cert"] == f"{TLS_DIR}/tls.crt"
    assert args["--tls-key"] == f"{TLS_DIR}/tls.key"
    assert args["--host"] == "0.0.0.0"
    assert args["--port"] == "8443"
    assert "--no-cluster" not in args and "--kubeconfig" not in args  # in-cluster account
    assert args["--metrics-port"] == "9090"  # /metrics off the TLS port, on a plain one (networkpolicy)
    assert [(p["name"], p["containerPort"]) for p in SERVER["ports"]] == [("https", 8443), ("metrics", 9090)]


def test_grace_period_outlasts_prestop_and_graceful_shutdown() -> None:
    shutdown = float(_args(SERVER).get("--shutdown-timeout", SHUTDOWN_DEFAULT))
    pre_stop = SERVER.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pre_stop > 0, "keep serving while the endpoint removal propagates"
    assert POD["terminationGracePeriodSeconds"] > pre_stop + shutdown
    # the drain (serving while not ready) is part of the shutdown timeout
    assert 0 < float(_args(SERVER).get("--drain", 5)) < shutdown


@pytest.mark.parametrize("where,pod", POD_SPECS, ids=[w for w, _ in POD_SPECS])
def test_every_pod_meets_the_restricted_pod_security_standard(where: str, pod: dict[str, Any]) -> None:
    # The namespace enforces "restricted"; this also makes the hardening explicit.
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= {"secret", "configMap", "emptyDir", "projected"}, volume
    for container in pod.get("initContainers", []) + pod["containers"]:
        uid = _effective("runAsUser", container, pod)
        assert isinstance(uid, int) and uid > 0, f"{where}: numeric non-root UID"
        gid = _effective("runAsGroup", container, pod)
        assert isinstance(gid, int) and gid > 0, f"{where}: numeric non-root GID"
        assert _effective("runAsNonRoot", container, pod) is True
        assert _effective("seccompProfile", container, pod) == {"type": "RuntimeDefault"}
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        assert not ctx.get("privileged")
        limits = container["resources"]["limits"]
        assert container["resources"]["requests"] and limits.get("memory"), where
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        tmp = mounts.get("/tmp")
        assert tmp and any(v["name"] == tmp and "emptyDir" in v for v in pod["volumes"]), \
            f"{where}: a read-only root needs a writable /tmp for Python"


def test_image_tag_is_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    for where, pod in POD_SPECS:
        for container in pod["containers"]:
            assert container["image"] == f"gpu-admission:{version}", where


def test_tls_secret_and_policies_are_mounted_where_the_server_reads() -> None:
    mounts = {m["mountPath"]: m for m in SERVER["volumeMounts"]}
    volumes = {v["name"]: v for v in POD["volumes"]}
    tls, policies = mounts[TLS_DIR], mounts[POLICIES_DIR]
    assert volumes[tls["name"]]["secret"]["secretName"] == "gpu-admission-tls"
    assert volumes[policies["name"]]["configMap"]["name"] == "gpu-admission-policies"
    assert tls.get("readOnly") and policies.get("readOnly")
    # subPath mounts are never updated by the kubelet: no hot reload.
    assert not any("subPath" in m or "subPathExpr" in m for m in SERVER["volumeMounts"])
    assert deploy_tree.one("ConfigMap", "gpu-admission-policies", docs=BASE)


def test_probes_hit_the_right_endpoints_on_the_plain_port() -> None:
    """The kubelet presents no client certificate, which the TLS port requires with --client-ca:
    the probes use the plain port (--metrics-port), which serves /healthz and /readyz too."""
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    ports = {p["name"]: p["containerPort"] for p in SERVER["ports"]}
    for probe, path in expected.items():
        get = SERVER[probe]["httpGet"]
        assert (get["path"], get["scheme"]) == (path, "HTTP"), probe
        assert ports.get(get["port"], get["port"]) == int(_args(SERVER)["--metrics-port"]), probe


def test_runs_with_the_api_access_and_priority_it_needs() -> None:
    assert POD["automountServiceAccountToken"] is True
    assert POD["priorityClassName"] == "system-cluster-critical"
    quota = deploy_tree.one("ResourceQuota", docs=BASE)["spec"]["scopeSelector"]
    assert "system-cluster-critical" in quota["matchExpressions"][0]["values"]


def test_replicas_are_spread_across_nodes() -> None:
    assert DEPLOYMENT["spec"]["replicas"] >= 2
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert deploy_tree.labels_match(DEPLOYMENT["spec"]["selector"], labels)
    spread = [c for c in POD.get("topologySpreadConstraints", [])
              if c["topologyKey"] == "kubernetes.io/hostname"
              and c["whenUnsatisfiable"] == "DoNotSchedule" and c["maxSkew"] == 1
              and deploy_tree.labels_match(c["labelSelector"], labels)]
    anti = [t for t in POD.get("affinity", {}).get("podAntiAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
        if t["topologyKey"] == "kubernetes.io/hostname"
        and deploy_tree.labels_match(t["labelSelector"], labels)]
    assert spread or anti, "two replicas on one node die together"
    rolling = DEPLOYMENT["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0


def test_pdb_keeps_one_replica_of_these_pods() -> None:
    pdb = deploy_tree.one("PodDisruptionBudget", docs=BASE)
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert pdb["metadata"]["namespace"] == DEPLOYMENT["metadata"]["namespace"] == NAMESPACE
    assert deploy_tree.labels_match(pdb["spec"]["selector"], labels)
    assert pdb["spec"]["minAvailable"] == 1 < DEPLOYMENT["spec"]["replicas"]


def test_service_selects_the_pods() -> None:
    service = deploy_tree.one("Service", "gpu-admission", docs=BASE)
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert deploy_tree.labels_match({"matchLabels": service["spec"]["selector"]}, labels)
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("https", 443, "https"), ("metrics", 9090, "metrics")]


def test_the_network_policy_admits_the_webhook_port_and_the_metrics_port_only() -> None:
    """deploy/networkpolicy/: the admission port from an address block (the control plane's), the
    metrics port from the monitoring namespace; nothing else reaches the pods."""
    policy = deploy_tree.one("NetworkPolicy", "gpu-admission")
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == NAMESPACE and spec["policyTypes"] == ["Ingress"]
    assert deploy_tree.labels_match(spec["podSelector"], DEPLOYMENT["spec"]["template"]["metadata"]["labels"])
    ports = {p["name"]: p["containerPort"] for p in SERVER["ports"]}
    admission, metrics = spec["ingress"]
    assert admission["ports"] == [{"port": ports["https"], "protocol": "TCP"}]
    assert [set(f) for f in admission["from"]] == [{"ipBlock"}] and "except" not in admission["from"][0]["ipBlock"]
    assert metrics["ports"] == [{"port": ports["metrics"], "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_priority_classes_the_policies_refer_to() -> None:
    classes = {d.name: d.body for d in BASE if d.kind == "PriorityClass"}
    assert {n: (c["value"], c.get("preemptionPolicy", "PreemptLowerPriority"))
            for n, c in classes.items()} == {
        "gpu-inference": (100000, "PreemptLowerPriority"),
        "gpu-training": (50000, "PreemptLowerPriority"),
        "gpu-notebook": (30000, "PreemptLowerPriority"),
        "gpu-batch": (10000, "Never"),
    }
    assert not any(c.get("globalDefault") for c in classes.values())


def test_runtime_class_is_optional_and_named_nvidia() -> None:
    assert not any(d.kind == "RuntimeClass" for d in BASE)
    rc = deploy_tree.one("RuntimeClass", "nvidia",
                         docs=deploy_tree.resolve(deploy_tree.DEPLOY / "runtimeclass"))
    assert rc["handler"] == "nvidia"


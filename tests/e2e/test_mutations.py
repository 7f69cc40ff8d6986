"""Each mutation of the mission, on real pods, as the real apiserver stores them."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, Refused, eventually

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def toleration_counts(stored: Object) -> Counter[tuple[Any, ...]]:
    return Counter((t.get("key"), t.get("operator"), t.get("value"), t.get("effect"))
                   for t in stored["spec"].get("tolerations") or [])


def assert_mutated_once(stored: Object, priority_class: str, priority: int) -> None:
    """Every mutation of the shipped gpu-defaults policy, each exactly once."""
    spec = stored["spec"]
    counts = toleration_counts(stored)
    assert counts[("nvidia.com/gpu", "Exists", None, "NoSchedule")] == 1, spec.get("tolerations")
    assert max(counts.values()) == 1, f"a toleration is duplicated: {spec['tolerations']}"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["priorityClassName"] == priority_class
    assert spec["priority"] == priority  # computed by the Priority plugin from the class we set
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    shm = [v for v in spec.get("volumes") or [] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert len(shm) == 1, spec.get("volumes")
    for container in spec["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container["name"]
        mounts = [m for m in container.get("volumeMounts") or [] if m["mountPath"] == "/dev/shm"]
        if "nvidia.com/gpu" in (container.get("resources") or {}).get("limits", {}):
            assert len(mounts) == 1 and mounts[0]["name"] == shm[0]["name"], container["name"]
    assert "gpu-admission.io/mutated" in stored["metadata"]["annotations"]


def test_a_gpu_pod_is_stored_with_every_mutation_once(admin: Kube, namespace: str) -> None:
    created = pod("train", namespace, gpu_container(memory="16Gi"),
                  labels={"gpu-admission.io/workload-class": "training"})
    stored = admin.create(created)
    assert_mutated_once(stored, "gpu-training", 50000)
    shm = next(v for v in stored["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    assert shm["emptyDir"]["sizeLimit"] == "8Gi"  # half the 16Gi memory limit
    # what is stored is what a later read returns: no second copy of anything on the way
    assert admin.get("v1", "Pod", "train", namespace)["spec"] == stored["spec"]


def test_a_gpu_container_without_a_memory_limit_gets_shm_sized_from_the_pods_own(admin: Kube, namespace: str) -> None:
    """Pod-level resources (spec.resources; beta and on by default since 1.34): the pod's memory
    limit binds a container without one, so /dev/shm is half of it, not the size for no limit (1Gi).
    A kube-apiserver without the feature drops the field after the mutating webhooks; the size stays."""
    stored = admin.create(pod("pod-level", namespace, gpu_container(memory=None),
                              resources={"limits": {"cpu": "4", "memory": "8Gi"}}))
    shm = next(v for v in stored["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    assert shm["emptyDir"]["sizeLimit"] == "4Gi"
    assert [m["mountPath"] for m in stored["spec"]["containers"][0]["volumeMounts"]] == ["/dev/shm"]


def test_mig_pods_get_node_affinity_once(admin: Kube, namespace: str) -> None:
    stored = admin.create(pod("mig", namespace, gpu_container(gpus=None) | {
        "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1, "memory": "4Gi"}}}))
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "nvidia.com/mig.capable", "operator": "In", "values": ["true"]}]}
    ]


def test_a_user_affinity_term_gets_the_constraint_in_every_term(admin: Kube, namespace: str) -> None:
    terms = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
             {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    mig = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}
    stored = admin.create(pod("mig2", namespace, mig, affinity=affinity))
    stored_terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    mig_capable = {"key": "nvidia.com/mig.capable", "operator": "In", "values": ["true"]}
    for term in stored_terms["nodeSelectorTerms"]:
        assert term["matchExpressions"].count(mig_capable) == 1


def test_pods_without_gpus_are_not_touched(admin: Kube, namespace: str) -> None:
    plain = pod("web", namespace, {"name": "web", "image": "nginx", "resources": {"limits": {"memory": "1Gi"}}})
    stored = admin.create(plain)
    assert "runtimeClassName" not in stored["spec"] or stored["spec"]["runtimeClassName"] is None
    assert "gpu-admission.io/mutated" not in (stored["metadata"].get("annotations") or {})


def test_a_pod_asking_zero_gpus_is_a_cpu_pod(admin: Kube, namespace: str) -> None:
    """A Helm chart's CPU mode (``nvidia.com/gpu: "0"``) on a CUDA image gets no GPU runtime nor toleration."""
    cpu_mode = {"name": "c", "image": "nvidia/cuda:12.2.2-base-ubuntu22.04",
                "resources": {"limits": {"nvidia.com/gpu": "0", "cpu": "1"}}}
    stored = admin.create(pod("cpu-mode", namespace, cpu_mode))
    assert stored["spec"].get("runtimeClassName") is None
    assert GPU_TOLERATION not in (stored["spec"].get("tolerations") or [])
    assert "gpu-admission.io/mutated" not in (stored["metadata"].get("annotations") or {})
    # beside a GPU container, it is the container without a GPU: it sees none
    mixed = admin.create(pod("mixed", namespace, gpu_container(), cpu_mode | {"name": "helper"}))
    helper = next(c for c in mixed["spec"]["containers"] if c["name"] == "helper")
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in helper["env"]
    assert mixed["spec"]["runtimeClassName"] == "nvidia"


def test_a_root_pod_keeps_root_whole(admin: Kube, namespace: str) -> None:
    """runAsUser 0 on the pod: its containers keep root's capabilities; the pod gets no group or fsGroup."""
    stored = admin.create(pod("root", namespace, gpu_container(), {"name": "user", "image": "x"} | {
        "securityContext": {"runAsUser": 1000}}, securityContext={"runAsUser": 0}))
    security = stored["spec"]["securityContext"]
    assert security["runAsUser"] == 0 and security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"runAsNonRoot", "runAsGroup", "fsGroup", "fsGroupChangePolicy"} & security.keys(), security
    train, user = stored["spec"]["containers"]
    assert train["securityContext"] == {"allowPrivilegeEscalation": False}
    assert user["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # it chose another user


def test_each_workload_class_gets_its_priority_over_a_global_default(admin: Kube, namespace: str) -> None:
    default = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
               "metadata": {"name": "e2e-everyone"}, "value": 1000, "globalDefault": True}
    admin.create(default)
    try:
        plain = admin.create(pod("plain", namespace, {"name": "c", "image": "x"}))
        assert plain["spec"]["priorityClassName"] == "e2e-everyone"  # the Priority plugin at work
        for workload_class, (name, value) in {
            "training": ("gpu-training", 50000), "inference": ("gpu-inference", 100000),
            "notebook": ("gpu-notebook", 30000), "batch": ("gpu-batch", 10000),
        }.items():
            labels = {"gpu-admission.io/workload-class": workload_class}
            stored = _create_when_known(admin, pod(workload_class, namespace, gpu_container(), labels=labels))
            assert_mutated_once(stored, name, value)
    finally:
        admin.delete(default)


def _create_when_known(admin: Kube, obj: Object) -> Object:
    """Create ``obj``; while the server's view has not seen the new default class yet, try again."""
    def attempt() -> Object | None:
        stored = admin.create(obj, dry_run="All")
        return stored if stored["spec"]["priorityClassName"] != "e2e-everyone" else None
    eventually(attempt, what="the server seeing the globalDefault PriorityClass")
    return admin.create(obj)


def test_a_tenant_gets_only_the_priority_its_namespace_allows(admin: Kube, admission: object) -> None:
    """Issue #42 row 7: the inference label gives gpu-inference only in a namespace labelled
    workload-classes.gpu-admission.io/inference=true (the Priority plugin then stores its value);
    elsewhere the pod gets no GPU class (the cluster's default, 0 here); system-node-critical is refused."""
    allowed, plain = f"e2e-serving-{uuid.uuid4().hex[:6]}", f"e2e-tenant-{uuid.uuid4().hex[:6]}"
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
                  for name, labels in ((allowed, {OPT_IN: "true", "workload-classes.gpu-admission.io/inference": "true"}),
                                       (plain, {OPT_IN: "true"}))]
    for ns in namespaces:
        admin.create(ns)
    try:
        labels = {"gpu-admission.io/workload-class": "inference"}
        served = admin.create(pod("server", allowed, gpu_container(), labels=labels))
        assert (served["spec"]["priorityClassName"], served["spec"]["priority"]) == ("gpu-inference", 100000)
        tenant = admin.create(pod("server", plain, gpu_container(), labels=labels))
        assert "priorityClassName" not in tenant["spec"] and tenant["spec"].get("priority", 0) == 0
        with pytest.raises(Refused) as refused:
            admin.create(pod("critical", plain, gpu_container(), priorityClassName="system-node-critical"))
        assert "PriorityClass 'system-node-critical' is for the cluster's own components" in refused.value.message
        with pytest.raises(Refused) as named:
            admin.create(pod("named", plain, gpu_container(), priorityClassName="gpu-inference"))
        assert f"which namespace {plain} may not choose" in named.value.message
    finally:
        for ns in namespaces:
            admin.delete(ns)

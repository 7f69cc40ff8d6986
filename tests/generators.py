"""Hypothesis strategies for schema-valid GPU pods and the workloads that template them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

GPU_RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
MEMORY = ["64Mi", "100Mi", "1536Mi", "8Gi", "64Gi", "200Gi", "1G", "500M"]
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"operator": "Exists"},
    {"key": "example.com/pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
EXPRESSIONS = [
    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]},
    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]},
    {"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"},
    {"key": "nvidia.com/mig.capable", "operator": "In", "values": ["true"]},
    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]},
    {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]},
]


@st.composite
def containers(draw: Any, prefix: str, count: int, gpu_possible: bool) -> list[dict[str, Any]]:
    result = []
    for i in range(count):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": draw(st.sampled_from(["nvidia/cuda:12.4.1-base-ubuntu22.04", "busybox:1.36", "nvcr.io/nvidia/pytorch:24.05-py3"]))}
        limits: dict[str, Any] = {}
        if gpu_possible and draw(st.booleans()):
            # (0 too: a chart's CPU mode, which is no GPU)
            limits[draw(st.sampled_from(GPU_RESOURCES))] = str(draw(st.integers(0, 8)))
        if draw(st.booleans()):
            limits["memory"] = draw(st.sampled_from(MEMORY))
        if limits:
            c["resources"] = {"limits": limits}
            if draw(st.booleans()):
                c["resources"]["requests"] = dict(limits)
        if draw(st.integers(0, 4)) == 0:
            c["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        sc = draw(st.sampled_from([None, {"runAsUser": 0}, {"runAsNonRoot": False}, {"runAsUser": 1000},
                                   {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}},
                                   {"privileged": True}, {"capabilities": {"drop": ["NET_RAW"]}},
                                   {"allowPrivilegeEscalation": True}, {"seccompProfile": {"type": "RuntimeDefault"}}]))
        if sc is not None:
            c["securityContext"] = sc
        if draw(st.integers(0, 5)) == 0:
            c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": draw(st.sampled_from(["all", "void", "0"]))}]
        result.append(c)
    return result


@st.composite
def pod_specs(draw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(containers("c", draw(st.integers(1, 3)), True))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(containers("init", draw(st.integers(1, 2)), True))
    if any(m.get("name") == "dshm" for c in spec["containers"] + spec.get("initContainers", []) for m in c.get("volumeMounts", [])):
        spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if draw(st.booleans()):
        spec.setdefault("volumes", []).append(
            {"name": draw(st.sampled_from(["gpu-admission-shm", "data"])), "configMap": {"name": "cfg"}}
        )
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(st.sampled_from(TOLERATIONS), max_size=3, unique_by=str))
    if draw(st.booleans()):
        spec["nodeSelector"] = {"nvidia.com/gpu.product": draw(st.sampled_from(["NVIDIA-A100-SXM4-80GB", "Tesla-T4"]))}
    if draw(st.booleans()):
        terms = draw(st.lists(st.lists(st.sampled_from(EXPRESSIONS), min_size=1, max_size=2, unique_by=str), min_size=1, max_size=3))
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}
    if draw(st.booleans()):
        spec["securityContext"] = draw(st.sampled_from([{}, {"runAsUser": 0}, {"runAsNonRoot": False},
                                                        {"runAsNonRoot": True, "runAsUser": 2000}, {"fsGroup": 5}]))
    if draw(st.booleans()):
        spec["runtimeClassName"] = draw(st.sampled_from(["nvidia", "kata"]))
        if draw(st.booleans()):
            spec["overhead"] = {"cpu": "250m"}
    if draw(st.booleans()):
        spec["priority"] = 0
        spec["preemptionPolicy"] = "PreemptLowerPriority"
    return spec


OWNERS = [None, "Job", "ReplicaSet", "PyTorchJob", "StatefulSet"]
#: labels the owning controller puts on its pods
OWNER_LABELS = {
    "Job": {"batch.kubernetes.io/job-name": "o"},
    "ReplicaSet": {"pod-template-hash": "5d9c"},
    "PyTorchJob": {"training.kubeflow.org/job-name": "o", "training.kubeflow.org/replica-index": "0"},
    "StatefulSet": {"statefulset.kubernetes.io/pod-name": "w-0", "controller-revision-hash": "w-6f"},
}


@st.composite
def workloads(draw: Any) -> dict[str, Any]:
    """A Pod, or a built-in workload whose template holds the generated pod spec."""
    spec = draw(pod_specs())
    labels = {"app": "w"}
    kind = draw(st.sampled_from(["Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"]))
    if kind == "Pod":
        meta: dict[str, Any] = {"name": "w", "namespace": "ml", "labels": labels}
        owner = draw(st.sampled_from(OWNERS))
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": owner, "name": "o", "uid": "u-1"}]
            labels.update(OWNER_LABELS[owner])
        if draw(st.integers(0, 4)) == 0:
            labels["notebook-name"] = "nb"
        if draw(st.booleans()):
            spec["activeDeadlineSeconds"] = draw(st.sampled_from([600, 43200, 200000]))
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if draw(st.booleans()):
        spec["affinity"] = {**spec.get("affinity", {}), "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}}]}}
    template = {"metadata": {"labels": labels}, "spec": spec}
    meta = {"name": "w", "namespace": "ml"}
    if kind in ("Job", "CronJob"):
        spec["restartPolicy"] = "Never"
        job = {"template": template}
        job_spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": job}} if kind == "CronJob" else job
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta, "spec": job_spec}
    body: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": template}
    if kind == "StatefulSet":
        body["serviceName"] = "w"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}

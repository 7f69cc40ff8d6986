"""Objects the end-to-end tests create: GPU pods, workloads, nodes as a kubelet would register them."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client

from tests.e2e.admission import NAMESPACE, Admission
from tests.e2e.kube import Kube, Object, eventually
from webhook.ledger import document


def _labelled_policy(name: str, label: str, kinds: str, rules: str) -> str:
    """A policy for the namespaces labelled ``label: on``, added to the shipped ones in the e2e policy directory."""
    return (
        f"apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nmetadata: {{name: {name}}}\n"
        f"spec:\n  order: 300\n  match:\n    kinds: [{kinds}]\n"
        f'    namespaceSelector: {{matchLabels: {{{label}: "on"}}}}\n  rules:\n{rules}'
    )


#: GPU caps in namespaces labelled for them
QUOTA_LABEL = "e2e.gpu-admission.io/quota"
QUOTA_POLICY = _labelled_policy("e2e-quota", QUOTA_LABEL, '"*"', """\
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {scope: namespace, max: 2}
""")

#: a namespace cap of 4 GPUs, charged to the ledger, in namespaces labelled for it: what a ResourceClaim
#: of 4 devices fills exactly (tests/e2e/test_dra_shared_claims.py)
CLAIMS_CAP_LABEL = "e2e.gpu-admission.io/claims-cap"
CLAIMS_CAP = 4
CLAIMS_CAP_POLICY = _labelled_policy("e2e-claims-cap", CLAIMS_CAP_LABEL, '"*"', f"""\
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {{scope: namespace, max: {CLAIMS_CAP}}}
""")

#: the GPU caps of issue 33's measurements, in namespaces labelled for them: 5 GPUs a namespace,
#: 8 a team (namespaces sharing a value of the label ``team``), charged to the ledger (docs/quota.md)
BURST_LABEL = "e2e.gpu-admission.io/burst"
BURST_POLICY = _labelled_policy("e2e-burst", BURST_LABEL, "Pod", """\
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {scope: namespace, max: 5}
        - {scope: team, max: 8}
""")

#: a team cap of 8 GPUs (namespaces sharing a value of ``team``), in namespaces labelled for it: written by the
#: placement suite (tests/e2e/placement/conftest.py) for its own package only, where controllers make the pods
PLACEMENT_CAP_LABEL = "e2e.gpu-admission.io/placement-cap"
PLACEMENT_CAP = 8
PLACEMENT_CAP_POLICY = _labelled_policy("e2e-placement-cap", PLACEMENT_CAP_LABEL, "Pod", f"""\
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {{scope: team, max: {PLACEMENT_CAP}}}
""")

#: caps far enough from a burst that replicas reserve room under them (docs/quota.md, "Reservations"):
#: 64 GPUs a namespace and a team
RESERVE_LABEL = "e2e.gpu-admission.io/reserve"
RESERVE_CAP = 64
RESERVE_POLICY = _labelled_policy("e2e-reserve", RESERVE_LABEL, "Pod", f"""\
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {{scope: namespace, max: {RESERVE_CAP}}}
        - {{scope: team, max: {RESERVE_CAP}}}
""")

#: a rule in audit mode in namespaces labelled for it: no pod may hold a GPU, which refuses nothing
AUDIT_LABEL = "e2e.gpu-admission.io/audit"
AUDIT_POLICY = _labelled_policy("e2e-audit", AUDIT_LABEL, "Pod", """\
    resourceShape: {mode: audit, maxPerPod: 0, nodeCapacity: false}
""")

#: pods named exempt-* (or generated from that prefix) skip the GPU resource shape in the suite's namespaces
EXEMPT_PREFIX = "exempt-"
EXCEPTION = f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicyException
metadata: {{name: e2e-exempt-shape}}
spec:
  exceptions: [{{policy: gpu-validations, rules: [resourceShape]}}]
  match: {{kinds: [Pod], namespaces: ["e2e-*"], names: ["{EXEMPT_PREFIX}*"]}}
"""

CUDA_124 = "nvcr.io/nvidia/pytorch:24.05-py3"  # CUDA 12.4.1 (FACTS.md §4): driver >= 550.54.15
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_container(name: str = "train", gpus: Any = 1, image: str = "nvidia/cuda:12.2.0-base-ubuntu22.04",
                  requests: Any = None, memory: str | None = "8Gi") -> Object:
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus} if gpus is not None else {}
    if memory:
        limits["memory"] = memory
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": image, "resources": resources}


def pod(name: str, namespace: str, *containers: Object, labels: dict[str, str] | None = None, **spec: Any) -> Object:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": list(containers) or [gpu_container()], **spec},
    }


def template_of(p: Object) -> Object:
    return {"metadata": {"labels": {"app": p["metadata"]["name"]}}, "spec": copy.deepcopy(p["spec"])}


def deployment(name: str, namespace: str, *containers: Object) -> Object:
    template = template_of(pod(name, namespace, *containers))
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def daemon_set(name: str, namespace: str, *containers: Object, **spec: Any) -> Object:
    template = template_of(pod(name, namespace, *containers, **spec))
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": template}}


def replication_controller(name: str, namespace: str, *containers: Object) -> Object:
    template = template_of(pod(name, namespace, *containers))
    return {
        "apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"app": name}, "template": template},
    }


def pod_template(name: str, namespace: str, *containers: Object) -> Object:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name, "namespace": namespace},
            "template": template_of(pod(name, namespace, *containers))}


def job(name: str, namespace: str, *containers: Object) -> Object:
    template = template_of(pod(name, namespace, *containers))
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": template}}


def cronjob(name: str, namespace: str, *containers: Object) -> Object:
    spec = job(name, namespace, *containers)["spec"]
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": spec}}}


def gpu_node(name: str, driver: str, product: str = "NVIDIA-A100-SXM4-80GB", gpus: int = 8,
             extra_labels: dict[str, str] | None = None, *, cpu: str = "96", memory: str = "1Ti",
             extra_capacity: dict[str, str] | None = None, taint: bool = True) -> Object:
    """A GPU node as the kubelet registers it, with GPU Feature Discovery's labels and the GPU taint
    (``taint=False``: without it); ``extra_capacity`` adds resources (MIG devices)."""
    major, minor, rev = (driver.split(".") + ["", ""])[:3]
    labels = {
        "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus), "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": major, "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev, **(extra_labels or {}),
    }
    capacity = {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": memory, "pods": "110", **(extra_capacity or {})}
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if taint else []
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "registering"}],
        },
    }


def cpu_node(name: str, extra_labels: dict[str, str] | None = None, *, cpu: str = "96", memory: str = "1Ti") -> Object:
    """A node without GPUs, as the kubelet registers it."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(extra_labels or {})}},
        "status": {"capacity": capacity, "allocatable": dict(capacity),
                   "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                   "message": "registering"}]},
    }


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


def make_ready(admin: Kube, stored: Object) -> Object:
    """What the node lifecycle controller does when the kubelet reports Ready: the condition, and the
    ``node.kubernetes.io/not-ready`` taint that kube-apiserver's TaintNodesByCondition gave it removed."""
    admin.patch(stored, {"status": {"conditions": [READY]}}, content_type="application/strategic-merge-patch+json",
                subresource="status")
    taints = [t for t in stored["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
    return admin.patch(stored, {"spec": {"taints": taints}})


def register_node(admin: Kube, admission: Admission, node: Object, *, ready: bool) -> Object:
    """Create ``node``; with ``ready``, do what the node lifecycle controller does when the kubelet reports Ready."""
    stored = admin.create(node)
    assert any(t["key"] == "node.kubernetes.io/not-ready" for t in stored["spec"].get("taints") or []), (
        "kube-apiserver's TaintNodesByCondition should taint a new node not-ready"
    )
    if ready:
        stored = make_ready(admin, stored)
    wait_for_view(admin, admission, "nodes", "v1", "Node")
    return stored


def native_quota(admin: Kube, admission: Admission, namespace: str, gpus: int) -> Object:
    """A ResourceQuota of ``gpus`` on requests.nvidia.com/gpu, with the status the quota controller would
    write (without one, kube-apiserver refuses every pod there), held by the server's view."""
    quota = admin.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": namespace},
                          "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}})
    admin.patch(quota, {"status": {"hard": {"requests.nvidia.com/gpu": str(gpus)},
                                   "used": {"requests.nvidia.com/gpu": "0"}}}, subresource="status")
    wait_for_view(admin, admission, "resourcequotas", "v1", "ResourceQuota")
    return quota


def wait_for_view(admin: Kube, admission: Admission, resource: str, api_version: str, kind: str) -> None:
    """Until the server's cluster view holds as many ``resource`` as the apiserver lists."""
    want = len(admin.list(api_version, kind))
    eventually(lambda: admission.view_count(resource) == want, what=f"the cluster view holding {want} {resource}")


def ledgers(admin: Kube) -> list[dict[str, Any]]:
    """The GPU quota ledger objects the suite's server writes."""
    custom = client.CustomObjectsApi(admin.api)
    listed: Any = custom.list_namespaced_custom_object(document.GROUP, document.VERSION, NAMESPACE,
                                                       document.PLURAL)
    return list(listed["items"])


def ledger(admin: Kube, scope: str, group: str) -> dict[str, document.Entry]:
    """What one ledger holds, by pod uid ({} before the ledger exists)."""
    for key, held in document.effective(ledgers(admin)).items():
        if key.scope == scope and key.group == group:
            return held
    return {}


def charged(admin: Kube, namespace: str) -> dict[str, document.Entry]:
    """The charges of one namespace's pods, in whichever ledger holds them (its team's, or its own)."""
    return {uid: entry for held in document.effective(ledgers(admin)).values() for uid, entry in held.items()
            if entry.holding.namespace == namespace}

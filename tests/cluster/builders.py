"""Plain Kubernetes objects for the cluster tests, shaped like the API server's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]


def names(objects: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names of some objects, to compare what a view holds."""
    return {o["metadata"]["name"] for o in objects}


def pod(name: str, namespace: str = "default", *, gpus: int = 1, resource: str = "nvidia.com/gpu",
        phase: str = "Running", node: str | None = None) -> Obj:  # fmt: skip
    """A pod; ``gpus=0`` makes a CPU-only one. Carries fields the index must drop."""
    resources: Obj = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    if gpus:
        resources["limits"][resource] = str(gpus)
    spec: Obj = {
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "command": ["python", "train.py"], "env": [{"name": "X", "value": "1"}],
                        "resources": resources}],  # fmt: skip
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "serviceAccountName": "default",
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                     "annotations": {"team": "ml", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": spec,
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.1"},
    }  # fmt: skip


def node(name: str, *, product: str = "NVIDIA-H100-80GB-HBM3", driver: str = "550.107.02") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product,
                                              "nvidia.com/cuda.driver-version.full": driver,
                                              "nvidia.com/gpu.count": "8"}},  # fmt: skip
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "95"},
            "images": [{"names": [f"registry.example/image-{i}:latest"], "sizeBytes": 10**9} for i in range(30)],
            "nodeInfo": {"kubeletVersion": "v1.31.0"},
        },
    }


def namespace(name: str, **labels: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}}


def quota(name: str, namespace: str, gpus: int) -> Obj:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}}  # fmt: skip


def priority_class(name: str, value: int) -> Obj:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "preemptionPolicy": "PreemptLowerPriority"}  # fmt: skip


def runtime_class(name: str, handler: str = "nvidia") -> Obj:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}

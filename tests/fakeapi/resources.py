"""The REST resources the fake serves, and how their objects are found.

:data:`TYPES` is every resource the fake knows. :func:`type_of` and
:func:`type_named` find the one an object or a name belongs to;
:func:`object_key` is the etcd-like key objects are stored and listed under.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives and what its objects are called."""

    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How kube-apiserver names the resource in messages (``x.group``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


TYPES: tuple[ResourceType, ...] = (
    ResourceType("nodes", "Node"),
    ResourceType("namespaces", "Namespace"),
    ResourceType("pods", "Pod", namespaced=True),
    ResourceType("resourcequotas", "ResourceQuota", namespaced=True),
    ResourceType("secrets", "Secret", namespaced=True),
    ResourceType("configmaps", "ConfigMap", namespaced=True),
    # workloads, for the audit CLI's --cluster
    ResourceType("podtemplates", "PodTemplate", namespaced=True),
    ResourceType("replicationcontrollers", "ReplicationController", namespaced=True),
    ResourceType("deployments", "Deployment", "apps", namespaced=True),
    ResourceType("statefulsets", "StatefulSet", "apps", namespaced=True),
    ResourceType("daemonsets", "DaemonSet", "apps", namespaced=True),
    ResourceType("replicasets", "ReplicaSet", "apps", namespaced=True),
    ResourceType("jobs", "Job", "batch", namespaced=True),
    ResourceType("cronjobs", "CronJob", "batch", namespaced=True),
    ResourceType("priorityclasses", "PriorityClass", "scheduling.k8s.io"),
    ResourceType("runtimeclasses", "RuntimeClass", "node.k8s.io"),
    ResourceType("deviceclasses", "DeviceClass", "resource.k8s.io"),
    ResourceType("resourceclaimtemplates", "ResourceClaimTemplate", "resource.k8s.io", namespaced=True),
    ResourceType("resourceclaims", "ResourceClaim", "resource.k8s.io", namespaced=True),
    ResourceType("resourceslices", "ResourceSlice", "resource.k8s.io"),
    # reports, for gpu-admission report
    ResourceType("policyreports", "PolicyReport", "wgpolicyk8s.io", "v1alpha2", namespaced=True),
    ResourceType("clusterpolicyreports", "ClusterPolicyReport", "wgpolicyk8s.io", "v1alpha2"),
    ResourceType("reports", "Report", "openreports.io", "v1alpha1", namespaced=True),
    ResourceType("clusterreports", "ClusterReport", "openreports.io", "v1alpha1"),
    # the GPU quota ledger's objects (deploy/base/quota-ledger-crd.yaml)
    ResourceType("gpuquotaledgers", "GPUQuotaLedger", "gpu-admission.io", "v1alpha1", namespaced=True),
    ResourceType(
        "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", "admissionregistration.k8s.io"
    ),
    ResourceType(
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io",
    ),
)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
#: groups of custom resources (CRDs): the fake serves their discovery documents (``/apis/<group>/<version>``),
#: and a test may take a CRD away (``FakeApiServer.serve``). (Built-in groups have none: like
#: kube-apiserver before 1.34 for resource.k8s.io/v1, which tests/cluster relies on.)
CUSTOM_GROUPS = frozenset({"gpu-admission.io", "wgpolicyk8s.io", "openreports.io"})


def type_of(obj: Mapping[str, Any]) -> ResourceType:
    """The resource an object belongs to, from its ``kind`` and ``apiVersion``."""
    for rt in TYPES:
        if rt.kind == obj.get("kind") and rt.api_version == obj.get("apiVersion", rt.api_version):
            return rt
    raise ValueError(f"the fake serves no kind {obj.get('kind')!r}")


def type_named(name: str) -> ResourceType:
    """The resource with this kind or plural."""
    for rt in TYPES:
        if name in (rt.kind, rt.plural):
            return rt
    raise ValueError(f"the fake serves no resource {name!r}")


def object_key(obj: Mapping[str, Any]) -> str:
    """The etcd-like sort key: ``namespace/name``, or ``name`` when cluster scoped."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])

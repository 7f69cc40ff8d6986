"""The resources the index can watch: how to list them, what to keep of them.

Each is listed cluster-wide through the generated ``kubernetes`` client call
(``CoreV1Api.list_node`` ...) with ``_preload_content=False``: the index
parses the JSON itself and keeps plain dicts, which is what the policy core
reads, and skips the client's model deserialisation (slow, and a second copy
of every object).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kubernetes import client

from webhook.cluster import pods
from webhook.view.protocol import Resource

Shaper = Callable[[pods.Raw], "pods.Raw | None"]

# Node status fields that are large and that no policy reads: the image list
# alone is often 10-50 KB per node.
_NODE_STATUS_DROPPED = ("images", "volumesInUse", "volumesAttached")


@dataclass(frozen=True)
class Kind:
    """One watchable resource."""

    resource: str  # a resource of the cluster view, or (the quota ledger) another plural
    kind: str
    api_version: str
    api: str  # the kubernetes.client API class
    list_method: str  # its cluster-wide list (and watch) call

    def lister(self, api_client: client.ApiClient) -> Callable[..., Any]:
        """The bound list call, e.g. ``CoreV1Api(api_client).list_node``."""
        return getattr(getattr(client, self.api)(api_client), self.list_method)  # type: ignore[no-any-return]


KINDS: Mapping[Resource, Kind] = MappingProxyType(
    {
        "nodes": Kind("nodes", "Node", "v1", "CoreV1Api", "list_node"),
        "namespaces": Kind("namespaces", "Namespace", "v1", "CoreV1Api", "list_namespace"),
        "pods": Kind("pods", "Pod", "v1", "CoreV1Api", "list_pod_for_all_namespaces"),
        "resourcequotas": Kind(
            "resourcequotas", "ResourceQuota", "v1", "CoreV1Api", "list_resource_quota_for_all_namespaces"
        ),
        "priorityclasses": Kind(
            "priorityclasses", "PriorityClass", "scheduling.k8s.io/v1", "SchedulingV1Api", "list_priority_class"
        ),
        "runtimeclasses": Kind(
            "runtimeclasses", "RuntimeClass", "node.k8s.io/v1", "NodeV1Api", "list_runtime_class"
        ),
        # Dynamic Resource Allocation (resource.k8s.io/v1, served from Kubernetes 1.34)
        "deviceclasses": Kind(
            "deviceclasses", "DeviceClass", "resource.k8s.io/v1", "ResourceV1Api", "list_device_class"
        ),
        "resourceclaimtemplates": Kind(
            "resourceclaimtemplates", "ResourceClaimTemplate", "resource.k8s.io/v1", "ResourceV1Api",
            "list_resource_claim_template_for_all_namespaces",
        ),
        "resourceclaims": Kind(
            "resourceclaims", "ResourceClaim", "resource.k8s.io/v1", "ResourceV1Api",
            "list_resource_claim_for_all_namespaces",
        ),
        "resourceslices": Kind(
            "resourceslices", "ResourceSlice", "resource.k8s.io/v1", "ResourceV1Api", "list_resource_slice"
        ),
    }
)


def shaper(kind: Kind, is_gpu: pods.ResourcePredicate) -> Shaper:
    """What the index keeps of an object of ``kind`` (None: not kept at all)."""
    if kind.resource == "pods":
        return pods.gpu_pod_shaper(is_gpu)

    def shape(obj: pods.Raw) -> pods.Raw | None:
        return _slim(obj, kind)

    return shape


def _slim(obj: pods.Raw, kind: Kind) -> pods.Raw:
    """Drop what no policy reads; ``obj`` is freshly parsed, so it is edited in place."""
    obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
    meta = obj.get("metadata") or {}
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and pods.LAST_APPLIED in annotations:
        del annotations[pods.LAST_APPLIED]
    if kind.resource == "nodes":
        status = obj.get("status") or {}
        for name in _NODE_STATUS_DROPPED:
            status.pop(name, None)
    elif kind.resource == "resourceclaims":
        # what rules read: the requests, and which devices were allocated (not the
        # reservedFor list, which can name thousands of pods of a shared claim)
        status = obj.get("status") or {}
        obj["status"] = {"allocation": status["allocation"]} if status.get("allocation") else {}
    return obj

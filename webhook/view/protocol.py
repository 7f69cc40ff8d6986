"""The read-only cluster view the engine consults: the :class:`ClusterView` protocol and what it speaks of.

The engine never talks to the API server. Whatever it needs to know about the
cluster (GPU nodes, namespace labels, GPU pods for quota usage, quotas,
priority and runtime classes, and image configs a registry resolver has
read) reaches it through :class:`ClusterView`. The
server implements it with a list+watch index (``webhook.cluster``); the audit
CLI and the tests implement it with :class:`~webhook.view.snapshot.SnapshotView`, built from plain
Kubernetes objects such as ``kubectl get nodes -o yaml`` prints.

Objects are plain dicts in the Kubernetes JSON shape. Pods handed out by a
view may be trimmed to the fields quota and scheduling checks read:
metadata (name, namespace, uid, labels, annotations, ownerReferences,
deletionTimestamp),
spec (nodeName, nodeSelector, affinity, tolerations, priorityClassName,
containers[].name/resources, initContainers[].name/resources/restartPolicy) and
status.phase.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from webhook.view.nodegroups import NodeGroup
from webhook.kube.resource_slices import Device
from webhook.view.usage import UsageView
from webhook.gpu.images import ImageConfig

Object = Mapping[str, Any]

#: The kinds of cluster state a view can hold.
Resource = Literal[
    "nodes", "namespaces", "pods", "resourcequotas", "priorityclasses", "runtimeclasses",
    "deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourceslices",
]
RESOURCES: tuple[Resource, ...] = (
    "nodes",
    "namespaces",
    "pods",
    "resourcequotas",
    "priorityclasses",
    "runtimeclasses",
    *("deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourceslices"),
)
#: Dynamic Resource Allocation (resource.k8s.io/v1): only watched where the cluster serves it
DRA_RESOURCES: tuple[Resource, ...] = ("deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourceslices")


@dataclass(frozen=True)
class Availability:
    """Whether a view can answer for one resource, and why not if it cannot."""

    known: bool
    reason: str = ""


KNOWN = Availability(True)


class ClusterView(Protocol):
    """Read-only cluster facts. Every method is cheap and never blocks on I/O."""

    def availability(self, resource: Resource) -> Availability:
        """Known (synced and fresh) or not, with a reason for a message."""

    def namespace(self, name: str) -> Object | None:
        """The Namespace object, or None when unknown."""

    def nodes(self) -> Iterable[Object]:
        """All nodes."""

    def pods(self, namespace: str | None = None) -> Iterable[Object]:
        """Pods that request GPU-like extended resources (all namespaces when None)."""

    def resource_quotas(self, namespace: str) -> Iterable[Object]:
        """ResourceQuota objects of one namespace."""

    def priority_class(self, name: str) -> Object | None:
        """The PriorityClass of that name, or None."""

    def runtime_class(self, name: str) -> Object | None:
        """The RuntimeClass of that name, or None."""

    def node_groups(self) -> Sequence[NodeGroup]:
        """All nodes, grouped by what the node filter reads (``webhook.view.nodegroups``)."""

    def gpu_usage(self, model_label: str, team_labels: Iterable[str] = ()) -> UsageView:
        """GPUs held per namespace, and per team for each team label (``webhook.view.usage``).

        Extended resources only: devices of DRA claims are counted from :meth:`claim_pods`.
        """

    def claim_pods(self) -> Iterable[Object]:
        """The pods of :meth:`pods` that name resourceClaims."""
    def image_config(self, image: str) -> ImageConfig | None:
        """What a registry resolver has read from the image's config already, or None."""
    def device_class(self, name: str) -> Object | None:
        """The DeviceClass of that name, or None."""

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        """The ResourceClaimTemplate, or None."""

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        """The ResourceClaim, or None."""

    def resource_slices(self) -> Iterable[Object]:
        """All ResourceSlices (devices a driver publishes, per node or pool)."""

    def published_device(self, driver: str, pool: str, name: str) -> Device | None:
        """The device of a ResourceSlice by the names a claim's allocation gives, or None."""

"""The read-only cluster view the engine consults, and a snapshot built from files.

The engine never talks to the API server. Whatever it needs to know about the
cluster (GPU nodes, namespace labels, GPU pods for quota usage, quotas,
priority and runtime classes) reaches it through :class:`ClusterView`. The
server implements it with a list+watch index (``webhook.cluster``); the audit
CLI and the tests implement it with :class:`SnapshotView`, built from plain
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

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

    def device_class(self, name: str) -> Object | None:
        """The DeviceClass of that name, or None."""

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        """The ResourceClaimTemplate, or None."""

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        """The ResourceClaim, or None."""

    def resource_slices(self) -> Iterable[Object]:
        """All ResourceSlices (devices a driver publishes, per node or pool)."""


@dataclass(frozen=True)
class SnapshotView:
    """A view over a fixed set of objects: for the audit CLI and for tests.

    Resources in ``known`` answer as synced; the others as unknown, so rules
    that need them behave as they would on a server without cluster access.
    """

    objects_by_kind: Mapping[str, tuple[Object, ...]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()
    #: why a resource is unknown, for messages; {resource} is filled in
    unknown_reason: str = "no {resource} in the cluster snapshot"

    @classmethod
    def from_objects(cls, objects: Iterable[Object], *, known: Iterable[str] = ()) -> SnapshotView:
        """Group plain objects by kind; ``List`` objects are flattened.

        Every resource whose kind appears among the objects counts as known,
        plus those named in ``known`` (an empty cluster is a known cluster).
        """
        grouped: dict[str, list[Object]] = {}
        for obj in flatten_lists(objects):
            grouped.setdefault(str(obj.get("kind", "")), []).append(obj)
        present = {_RESOURCE_OF_KIND[k] for k in grouped if k in _RESOURCE_OF_KIND}
        return cls(
            objects_by_kind={k: tuple(v) for k, v in grouped.items()},
            known=frozenset(present) | frozenset(known),
        )

    @cached_property
    def _availability(self) -> dict[str, Availability]:
        return {
            r: KNOWN if r in self.known else Availability(False, self.unknown_reason.format(resource=r))
            for r in RESOURCES
        }

    def availability(self, resource: Resource) -> Availability:
        return self._availability[resource]

    def _of(self, kind: str) -> tuple[Object, ...]:
        return self.objects_by_kind.get(kind, ())

    def namespace(self, name: str) -> Object | None:
        return _by_name(self._of("Namespace"), name)

    def nodes(self) -> Iterable[Object]:
        return self._of("Node")

    def pods(self, namespace: str | None = None) -> Iterable[Object]:
        return [
            p
            for p in self._of("Pod")
            if namespace is None or p.get("metadata", {}).get("namespace") == namespace
        ]

    def resource_quotas(self, namespace: str) -> Iterable[Object]:
        return [
            q for q in self._of("ResourceQuota") if q.get("metadata", {}).get("namespace") == namespace
        ]

    def priority_class(self, name: str) -> Object | None:
        return _by_name(self._of("PriorityClass"), name)

    def runtime_class(self, name: str) -> Object | None:
        return _by_name(self._of("RuntimeClass"), name)

    def device_class(self, name: str) -> Object | None:
        return _by_name(self._of("DeviceClass"), name)

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        return _by_name(self._in("ResourceClaimTemplate", namespace), name)

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        return _by_name(self._in("ResourceClaim", namespace), name)

    def resource_slices(self) -> Iterable[Object]:
        return self._of("ResourceSlice")

    def _in(self, kind: str, namespace: str) -> list[Object]:
        return [o for o in self._of(kind) if (o.get("metadata") or {}).get("namespace", "default") == namespace]

    def with_objects(self, objects: Iterable[Object]) -> SnapshotView:
        """This snapshot plus the DRA objects among ``objects`` (a pod and its template in one stream).

        They are found, but their resources do not become known: manifests
        may hold some templates and leave others to the cluster, so a
        template missing from them proves nothing.
        """
        added: dict[str, list[Object]] = {}
        for obj in flatten_lists(objects):
            kind = str(obj.get("kind", ""))
            if _RESOURCE_OF_KIND.get(kind) in DRA_RESOURCES:
                added.setdefault(kind, []).append(obj)
        if not added:
            return self
        merged = {k: (*self.objects_by_kind.get(k, ()), *added.get(k, ())) for k in {*self.objects_by_kind, *added}}
        return SnapshotView(merged, self.known, self.unknown_reason)


#: what rules see without any cluster access (server --no-cluster or no credentials)
EMPTY_VIEW = SnapshotView(unknown_reason="{resource} unknown: gpu-admission runs without cluster access")

_RESOURCE_OF_KIND = {
    "Node": "nodes",
    "Namespace": "namespaces",
    "Pod": "pods",
    "ResourceQuota": "resourcequotas",
    "PriorityClass": "priorityclasses",
    "RuntimeClass": "runtimeclasses",
    "DeviceClass": "deviceclasses",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "ResourceSlice": "resourceslices",
}


def flatten_lists(objects: Iterable[Object]) -> Iterable[Object]:
    """The objects, with every ``List`` (kubectl's or an API list) replaced by its items."""
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        kind = str(obj.get("kind", ""))
        if kind.endswith("List") and isinstance(obj.get("items"), list):
            item_kind = kind[: -len("List")]
            # API list responses (NodeList, PodList) leave kind off their items.
            yield from flatten_lists(
                item if "kind" in item or not item_kind else {**item, "kind": item_kind}
                for item in obj["items"]
                if isinstance(item, dict)
            )
        else:
            yield obj


def _by_name(objects: Iterable[Object], name: str) -> Object | None:
    for obj in objects:
        if obj.get("metadata", {}).get("name") == name:
            return obj
    return None

"""The snapshot view: a :class:`~webhook.view.protocol.ClusterView` over a fixed set of objects.

The audit CLI and the tests build it from plain Kubernetes objects such as
``kubectl get nodes -o yaml`` prints; its aggregates are those the live index
keeps (:mod:`webhook.view.aggregates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from webhook.gpu.images import ImageConfig
from webhook.view.aggregates import AggregateAnswers, Aggregates
from webhook.view.protocol import DRA_RESOURCES, KNOWN, RESOURCES, Availability, Object, Resource

#: a SnapshotView's reason a resource is unknown ({resource} filled in)
NOT_IN_SNAPSHOT = "no {resource} in the cluster snapshot"


@dataclass(frozen=True)
class SnapshotView(AggregateAnswers):
    """A view over a fixed set of objects: for the audit CLI and for tests.

    Resources in ``known`` answer as synced; the others as unknown, so rules
    that need them behave as they would on a server without cluster access.
    """

    objects_by_kind: Mapping[str, tuple[Object, ...]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()
    #: why a resource is unknown, for messages; {resource} is filled in
    unknown_reason: str = NOT_IN_SNAPSHOT
    #: image reference → its config, as a registry resolver read it
    image_configs: Mapping[str, ImageConfig] = field(default_factory=dict)

    @classmethod
    def from_objects(
        cls, objects: Iterable[Object], *, known: Iterable[str] = (), unknown_reason: str = NOT_IN_SNAPSHOT
    ) -> SnapshotView:
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
            unknown_reason=unknown_reason,
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

    @cached_property
    def _by_name(self) -> dict[str, dict[str | None, Object]]:
        """Cluster-scoped objects by kind and name (the first of a repeated name, as a scan finds)."""
        found: dict[str, dict[str | None, Object]] = {}
        for kind in ("Namespace", "PriorityClass", "RuntimeClass", "DeviceClass"):
            named = found[kind] = {}
            for obj in self._of(kind):
                named.setdefault(_name(obj), obj)
        return found

    @cached_property
    def _in_namespace(self) -> dict[str, dict[str | None, list[Object]]]:
        """Pods, quotas and DRA claims by kind and namespace, in snapshot order."""
        found: dict[str, dict[str | None, list[Object]]] = {}
        for kind in ("Pod", "ResourceQuota", "ResourceClaimTemplate", "ResourceClaim"):
            by_namespace = found[kind] = {}
            for obj in self._of(kind):
                by_namespace.setdefault(_namespace(obj), []).append(obj)
        return found

    def aggregates(self) -> Aggregates:
        return self._aggregates

    @cached_property
    def _aggregates(self) -> Aggregates:
        aggregates = Aggregates()
        aggregates.replace_slices(self._of("ResourceSlice"))
        aggregates.replace_nodes(self._of("Node"))
        aggregates.replace_namespaces(self._of("Namespace"))
        aggregates.replace_pods(self._of("Pod"))
        return aggregates

    def namespace(self, name: str) -> Object | None:
        return self._by_name["Namespace"].get(name)

    def nodes(self) -> Iterable[Object]:
        return self._of("Node")

    def pods(self, namespace: str | None = None) -> Iterable[Object]:
        return list(self._of("Pod")) if namespace is None else self._in_namespace["Pod"].get(namespace, [])

    def resource_quotas(self, namespace: str) -> Iterable[Object]:
        return self._in_namespace["ResourceQuota"].get(namespace, [])

    def priority_class(self, name: str) -> Object | None:
        return self._by_name["PriorityClass"].get(name)

    def runtime_class(self, name: str) -> Object | None:
        return self._by_name["RuntimeClass"].get(name)

    def image_config(self, image: str) -> ImageConfig | None:
        return self.image_configs.get(image.strip())

    def device_class(self, name: str) -> Object | None:
        return self._by_name["DeviceClass"].get(name)

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        return self._named_in("ResourceClaimTemplate", namespace, name)

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        return self._named_in("ResourceClaim", namespace, name)

    def resource_slices(self) -> Iterable[Object]:
        return self._of("ResourceSlice")

    def _named_in(self, kind: str, namespace: str, name: str) -> Object | None:
        # a manifest without a namespace lands in whichever one it is applied to, as the pod naming it does
        by_namespace = self._in_namespace[kind]
        candidates = (*by_namespace.get(namespace, ()), *by_namespace.get(None, ()))
        return next((o for o in candidates if _name(o) == name), None)

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
        return dataclasses.replace(self, objects_by_kind=merged)


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


def _name(obj: Object) -> str | None:
    return _meta_text(obj, "name")


def _namespace(obj: Object) -> str | None:
    return _meta_text(obj, "namespace")


def _meta_text(obj: Object, key: str) -> str | None:
    """A metadata string; None for anything else, which no lookup by name can match."""
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else None

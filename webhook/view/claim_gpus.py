"""The GPUs a pod spec gets through its DRA claims, resolved through the cluster view.

A claim's GPU requests count as extended resources (webhook.gpu.device_classes),
so every rule keeps speaking of ``nvidia.com/gpu`` and ``nvidia.com/mig-*``:
a container that uses a GPU claim is a GPU container, and the pod's GPUs
are its extended resources plus its claims' devices. Devices of one claim
are counted once per pod, however many containers share the claim, and
however many of the pod's ``resourceClaims`` entries name it.

Counting a request: the largest GPU alternative of ``firstAvailable`` (it
may get any of them: caps and quotas are charged that, as ResourceQuota
charges a claim); ``allocationMode: All`` as the most devices of that
class any one node publishes in its ResourceSlices (1 when they are unknown).
Whether the pod fits on a node is a different question: there every
alternative stays open (``PodClaims.alternatives``, ``dra.fitting``), since
the scheduler takes the first that fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from webhook.gpu import products, resources
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube import dra
from webhook.view import devices
from webhook.view.protocol import ClusterView, Resource

#: request name → extended resource → devices
Counts = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Unresolved:
    """A claim the pod names that the view, which knows every claim or template, does not have."""

    claim: dra.PodClaim
    reason: str


@dataclass(frozen=True)
class PodClaims:
    """A pod spec's claims, resolved: GPU devices per claim and request, and what could not be resolved."""

    counts: dict[str, Counts] = field(default_factory=dict)  # pod claim name → its GPU requests
    unresolved: tuple[Unresolved, ...] = ()
    unknown: tuple[str, ...] = ()  # why some claims could not be looked up (view unavailable)
    #: native ResourceQuota item → devices the pod's templates will claim (named claims were charged already)
    quota: dict[str, int] = field(default_factory=dict)
    #: GPU models (GFD spelling) its GPU requests are confined to; None when one may get any model
    models: frozenset[str] | None = None
    #: per GPU request of its claims, the (device class, devices) it may get, in order (one node
    #: must hold one choice of them all: webhook.kube.dra.fitting)
    alternatives: tuple[tuple[tuple[str, int], ...], ...] = ()
    #: pod claim name → the ResourceClaim it holds (a shared claim is counted once across pods)
    held: dict[str, str] = field(default_factory=dict)

    def total(self) -> dict[str, Decimal]:
        """Extended resource → devices over every claim of the pod."""
        total: dict[str, Decimal] = {}
        for requests in self.counts.values():
            for counts in requests.values():
                for name, n in counts.items():
                    total[name] = total.get(name, Decimal(0)) + n
        return total


def resolve(
    spec: Mapping[str, Any], namespace: str, view: ClusterView, classes: Mapping[str, DeviceClassInfo],
    generated: Mapping[str, str] | None = None,
) -> PodClaims | None:
    """The pod spec's claims as the view knows them; None when it names no claim.

    ``generated`` (``dra.generated_claims`` of an existing pod): the ResourceClaims made for it from its
    templates. An existing pod holds those, so they are counted, not the template (which may be gone or
    changed since)."""
    claims = dra.pod_claims(spec)
    if not claims:
        return None
    found = _Resolution(namespace, view, classes)
    for claim in claims:
        made = (generated or {}).get(claim.name) if claim.template else None
        if made and view.resource_claim(namespace, made) is not None:
            claim = replace(claim, template="", claim=made)
        name = claim.template or claim.claim
        if not name:
            continue
        if claim.claim:
            if claim.claim in found.held.values():  # the same ResourceClaim again: allocated, and counted, once
                found.held[claim.name] = claim.claim
                continue
            found.held[claim.name] = claim.claim
        obj = view.resource_claim_template(namespace, name) if claim.template else view.resource_claim(namespace, name)
        if obj is None:
            found.missing(claim, name)
        else:
            found.add(claim, obj)
    return found.result()


@dataclass
class _Resolution:
    """What :func:`resolve` has found so far."""

    namespace: str
    view: ClusterView
    classes: Mapping[str, DeviceClassInfo]
    counts: dict[str, Counts] = field(default_factory=dict)
    unresolved: list[Unresolved] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    quota: dict[str, int] = field(default_factory=dict)
    models: list[str | None] = field(default_factory=list)
    alternatives: list[tuple[tuple[str, int], ...]] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)

    def add(self, claim: dra.PodClaim, obj: Mapping[str, Any]) -> None:
        requests = dra.requests_of(dra.claim_spec(obj))
        counts = request_counts(requests, self.view, self.classes)
        if counts:
            self.counts[claim.name] = counts
            self.models.extend(request_models(obj, counts, self.view, self.classes))
        gpu_requests = gpu_alternatives(requests, self.classes)
        self.alternatives.extend(gpu_requests)
        if claim.template:  # a named claim was charged when it was created
            for key, n in quota_items(gpu_requests).items():
                self.quota[key] = self.quota.get(key, 0) + n

    def missing(self, claim: dra.PodClaim, name: str) -> None:
        # absent proves something only where the view knows every one (an audit's
        # manifests may hold some templates and leave others to the cluster)
        resource: Resource = "resourceclaimtemplates" if claim.template else "resourceclaims"
        availability = self.view.availability(resource)
        if availability.known:
            kind = "ResourceClaimTemplate" if claim.template else "ResourceClaim"
            self.unresolved.append(Unresolved(claim, f"{kind} {self.namespace}/{name} does not exist"))
        else:
            self.unknown.append(availability.reason)

    def result(self) -> PodClaims:
        models = self.models
        confined = frozenset(m for m in models if m) if models and None not in models else None
        return PodClaims(self.counts, tuple(self.unresolved), tuple(dict.fromkeys(self.unknown)), self.quota,
                         confined, tuple(self.alternatives), dict(self.held))


def request_models(
    claim: Mapping[str, Any], counts: Counts, view: ClusterView, classes: Mapping[str, DeviceClassInfo]
) -> list[str | None]:
    """The GPU model of each GPU request: its allocated device's, else the productName its selector pins."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    got = {str(r.get("request", "")).split("/")[0]: r for r in results if isinstance(r, Mapping)}
    asks = {r.name: r for r in dra.requests_of(dra.claim_spec(claim))}
    found: list[str | None] = []
    for name in counts:
        product = None
        if name in got and view.availability("resourceslices").known:
            product = next((d.text("productName") for d in devices.allocated(view, [got[name]])), None)
        if product is None and name in asks:
            pinned = {dra.selected(a, "productName") for a in asks[name].alternatives if a.device_class in classes}
            product = pinned.pop() if len(pinned) == 1 else None
        found.append(products.label_value(product) if product else None)
    return found


def confine(models: frozenset[str] | None, claims: PodClaims | None) -> frozenset[str] | None:
    """The models a pod can get: its node constraints' (``models``) narrowed by its claims'."""
    if claims is None or claims.models is None:
        return models
    return claims.models if models is None else models & claims.models


def request_counts(
    requests: list[dra.ClaimRequest], view: ClusterView, classes: Mapping[str, DeviceClassInfo]
) -> Counts:
    """GPU requests of a claim: request name → extended resource → devices."""
    counts: Counts = {}
    for request in requests:
        best: tuple[int, str] | None = None
        for ask in request.alternatives:
            info = classes.get(ask.device_class)
            if info is None:
                continue
            n = devices.largest_node_count(view, info) if ask.all else ask.count
            resource = info.counts_as(dra.selected(ask, "profile"))
            if best is None or n > best[0]:
                best = (n, resource)
        if best is not None:
            counts[request.name] = {best[1]: best[0]}
    return counts


#: a native ResourceQuota item of DRA: ``<device-class>.deviceclass.resource.k8s.io/devices``
QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


def gpu_alternatives(
    requests: list[dra.ClaimRequest], classes: Mapping[str, DeviceClassInfo]
) -> list[tuple[tuple[str, int], ...]]:
    """Per request with a GPU alternative, its GPU alternatives as (device class, devices); All as 1."""
    found = []
    for request in requests:
        gpus = tuple((ask.device_class, ask.count) for ask in request.alternatives if ask.device_class in classes)
        if gpus:
            found.append(gpus)
    return found


def quota_items(requests: list[tuple[tuple[str, int], ...]]) -> dict[str, int]:
    """The native ResourceQuota items claims of these GPU requests (:func:`gpu_alternatives`) are charged:
    per request its largest alternative of each class."""
    items: dict[str, int] = {}
    for alternatives in requests:
        largest: dict[str, int] = {}
        for device_class, n in alternatives:
            largest[device_class] = max(largest.get(device_class, 0), n)
        for device_class, n in largest.items():
            key = device_class + QUOTA_SUFFIX
            items[key] = items.get(key, 0) + n
    return items


def container_slots(spec: Mapping[str, Any], claims: PodClaims, slots: resources.Slots) -> resources.Slots:
    """``slots`` plus, for each container using a GPU claim, the extended resources the claim counts as."""
    if not claims.counts:
        return slots
    merged = dict(slots)
    for ref in resources.containers(spec):
        names: set[str] = set()
        for claim, request in dra.container_claims(ref.container):
            for request_name, counts in claims.counts.get(claim, {}).items():
                if not request or request == request_name:
                    names.update(counts)
        if names:
            key = (ref.list_name, ref.index)
            merged[key] = merged.get(key, frozenset()) | names
    return merged

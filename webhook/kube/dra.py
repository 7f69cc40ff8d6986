"""Dynamic Resource Allocation claims: what a ResourceClaim asks for, and which claims a pod uses.

Kubernetes semantics in plain Python (resource.k8s.io, KEP-4381). Two shapes
of a request are read:

- v1 and v1beta2: ``requests[].exactly`` (one device class) or
  ``requests[].firstAvailable[]`` (alternatives, tried in order);
- v1beta1 and v1alpha3: the class, mode and count on the request itself
  (and ``firstAvailable`` beside them from 1.33).

``allocationMode`` is ``ExactCount`` (default, ``count`` default 1) or
``All`` (every matching device of the node: unknown until scheduling).
A pod names its claims in ``spec.resourceClaims`` (by
``resourceClaimTemplateName``, one claim per pod, or ``resourceClaimName``,
a claim shared by the pods naming it) and each container picks some of them
in ``resources.claims[]`` (``name``, optionally one ``request``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from webhook.kube.value_text import text

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
K = TypeVar("K")
#: per request, its alternatives as (kind of device, devices), in the order they are tried
Alternatives = Sequence[Sequence[tuple[K, int]]]
GROUP = "resource.k8s.io"


def is_claim(group: str, kind: str) -> bool:
    """A ResourceClaim or ResourceClaimTemplate (any served version)."""
    return group == GROUP and kind in CLAIM_KINDS


@dataclass(frozen=True)
class DeviceAsk:
    """One way a request can be satisfied: devices of one class."""

    device_class: str
    all: bool  # allocationMode All: every matching device of the node
    count: int  # ExactCount's count (1 when All: at least one)
    selectors: tuple[str, ...]  # CEL expressions
    admin_access: bool
    path: str  # where it is in the claim spec, for messages


@dataclass(frozen=True)
class ClaimRequest:
    """A named request of a claim: one ask, or alternatives (firstAvailable)."""

    name: str
    alternatives: tuple[DeviceAsk, ...]


@dataclass(frozen=True)
class PodClaim:
    """An entry of a pod's ``spec.resourceClaims``."""

    name: str
    template: str  # resourceClaimTemplateName, "" when none
    claim: str  # resourceClaimName, "" when none
    index: int


def claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The claim spec of a ResourceClaim (``spec``) or a ResourceClaimTemplate (``spec.spec``)."""
    spec = _map(obj.get("spec"))
    return _map(spec.get("spec")) if obj.get("kind") == "ResourceClaimTemplate" else spec


def requests_of(spec: Mapping[str, Any], base: str = "spec") -> list[ClaimRequest]:
    """Every request of a claim spec, in either API shape."""
    found = []
    for index, raw in enumerate(_list(_map(spec.get("devices")).get("requests"))):
        request = _map(raw)
        path = f"{base}.devices.requests[{index}]"
        alternatives: list[DeviceAsk] = []
        if isinstance(request.get("exactly"), Mapping):
            alternatives.append(_ask(request["exactly"], f"{path}.exactly"))
        elif request.get("deviceClassName"):
            alternatives.append(_ask(request, path))
        for sub_index, sub in enumerate(_list(request.get("firstAvailable"))):
            alternatives.append(_ask(_map(sub), f"{path}.firstAvailable[{sub_index}]"))
        found.append(ClaimRequest(text(request.get("name") or ""), tuple(alternatives)))
    return found


def _ask(raw: Mapping[str, Any], path: str) -> DeviceAsk:
    count = raw.get("count", 1)
    selectors = tuple(
        text(_map(_map(s).get("cel")).get("expression") or "") for s in _list(raw.get("selectors"))
    )
    return DeviceAsk(
        device_class=text(raw.get("deviceClassName") or ""),
        all=raw.get("allocationMode") == "All",
        count=count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1,
        selectors=tuple(s for s in selectors if s),
        admin_access=raw.get("adminAccess") is True,
        path=path,
    )


def pod_claims(spec: Mapping[str, Any]) -> list[PodClaim]:
    """The pod spec's ``resourceClaims`` entries."""
    claims = []
    for index, raw in enumerate(_list(spec.get("resourceClaims"))):
        entry = _map(raw)
        if entry.get("name"):
            claims.append(PodClaim(text(entry["name"]), text(entry.get("resourceClaimTemplateName") or ""),
                                   text(entry.get("resourceClaimName") or ""), index))
    return claims


def container_claims(container: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(pod claim name, request name or "" for all of its requests) a container uses."""
    for raw in _list(_map(container.get("resources")).get("claims")):
        entry = _map(raw)
        if entry.get("name"):
            yield text(entry["name"]), text(entry.get("request") or "")


#: how many choices :func:`fitting` tries before it gives up (upstream allows 32 requests of 8 alternatives)
_TRIES = 4096


def fitting(requests: Alternatives[K], room: Callable[[K], int]) -> dict[K, int] | None:
    """Devices per kind of one alternative per request that fit in ``room``, the first such choice
    in the order the scheduler tries them (firstAvailable in order, backtracking); None when none fits.

    Past ``_TRIES`` choices the answer is "fits" (the empty choice): a check built on this one never
    refuses what it could not rule out.
    """
    tries = 0

    def choose(index: int, taken: dict[K, int]) -> dict[K, int] | None:
        nonlocal tries
        if index == len(requests):
            return taken
        for kind, count in requests[index]:
            tries += 1
            if tries > _TRIES:
                return {}
            if taken.get(kind, 0) + count <= room(kind):
                found = choose(index + 1, {**taken, kind: taken.get(kind, 0) + count})
                if found is not None:
                    return found
        return None

    return choose(0, {})


def smallest(requests: Alternatives[K]) -> dict[K, int]:
    """Devices per kind when each request gets its alternative of the fewest devices (the first, on a tie)."""
    taken: dict[K, int] = {}
    for alternatives in requests:
        if alternatives:
            kind, count = min(alternatives, key=lambda a: a[1])
            taken[kind] = taken.get(kind, 0) + count
    return taken


# CEL selectors are not evaluated; the common equality forms tell a request's
# MIG profile and GPU model (NVIDIA's demo specs and docs write them so).
_ATTRIBUTE_EQUALS = re.compile(
    r"""device\.attributes\[\s*['"]([\w.\-/]+)['"]\s*\]\.(\w+)\s*==\s*['"]([^'"]+)['"]"""
)


def selected(ask: DeviceAsk, attribute: str) -> str | None:
    """The value a selector pins ``attribute`` to (``device.attributes['d'].attribute == 'v'``), if any."""
    for expression in ask.selectors:
        for _, name, value in _ATTRIBUTE_EQUALS.findall(expression):
            if name == attribute:
                return str(value)
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def generated_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name → the ResourceClaim it holds, from ``status.resourceClaimStatuses`` (the claims the
    resourceclaim controller made from templates: what an existing pod holds, whatever became of the template)."""
    found: dict[str, str] = {}
    for entry in _map(pod.get("status")).get("resourceClaimStatuses") or ():
        if isinstance(entry, Mapping) and entry.get("name") and entry.get("resourceClaimName"):
            found[str(entry["name"])] = str(entry["resourceClaimName"])
    return found

"""Which nodes a pod spec could land on, as the scheduler's filters decide.

Checked: ``spec.nodeName``; ``nodeSelector``; required node affinity (terms
ORed, expressions ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt, and
matchFields on metadata.name); NoSchedule/NoExecute taints against the
pod's tolerations (a cordoned node counts as tainted
node.kubernetes.io/unschedulable, as the scheduler treats it); and the GPU
resources in the node's allocatable. Not checked: free capacity right now,
pod (anti-)affinity and topology spread, which change by the second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from webhook.policy import quantity
from webhook.policy.patch import lookup, sublist

Object = Mapping[str, Any]

UNSCHEDULABLE_TAINT: Object = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

#: what the DaemonSet controller adds to every DaemonSet pod, so that its
#: pods run on cordoned and pressured nodes too
DAEMONSET_TOLERATIONS: tuple[Object, ...] = tuple(
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
    for key, effect in (
        ("not-ready", "NoExecute"),
        ("unreachable", "NoExecute"),
        ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"),
        ("pid-pressure", "NoSchedule"),
        ("unschedulable", "NoSchedule"),
    )
)


def node_name(node: Object) -> str:
    meta = node.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def node_labels(node: Object) -> Mapping[str, str]:
    """The node's labels as served (not copied: this runs for every node on every request)."""
    meta = node.get("metadata")
    raw = meta.get("labels") if isinstance(meta, Mapping) else None
    return raw if isinstance(raw, Mapping) else {}


def allocatable(node: Object, resource: str) -> Decimal:
    """How many of ``resource`` the node can give pods (0 when it has none)."""
    status = node.get("status")
    values = status.get("allocatable") if isinstance(status, Mapping) else None
    amount = quantity.parse_quantity(values.get(resource)) if isinstance(values, Mapping) else None
    return amount if amount is not None else Decimal(0)


def requirement_matches(expr: Object, labels: Mapping[str, str]) -> bool:
    """One node-selector requirement against a node's labels."""
    key, op = str(expr.get("key", "")), expr.get("operator")
    values = [str(v) for v in _list(expr.get("values"))]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        have, bound = _integer(labels[key]), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: Any, node: Object) -> bool:
    """A nodeSelectorTerm: every expression and field must hold; an empty term matches nothing."""
    if not isinstance(term, Mapping):
        return False
    exprs = [e for e in sublist(term, "matchExpressions") if isinstance(e, Mapping)]
    fields = [f for f in _list(term.get("matchFields")) if isinstance(f, Mapping)]
    if not exprs and not fields:
        return False
    labels = node_labels(node)
    node_fields = {"metadata.name": node_name(node)}
    return all(requirement_matches(e, labels) for e in exprs) and all(
        requirement_matches(f, node_fields) for f in fields
    )


def affinity_matches(spec: Object, node: Object) -> bool:
    """The pod's nodeSelector and required node affinity both admit the node."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        labels = node_labels(node)
        if any(labels.get(str(k)) != str(v) for k, v in selector.items()):
            return False
    required = lookup(spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"))
    if not isinstance(required, Mapping):
        return True
    terms = required.get("nodeSelectorTerms")
    return isinstance(terms, list) and any(term_matches(t, node) for t in terms)


def tolerates(toleration: Object, taint: Object) -> bool:
    """Kubernetes' ToleratesTaint: empty effect or key in the toleration match any."""
    effect, key = toleration.get("effect"), toleration.get("key")
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def taints_tolerated(tolerations: Iterable[Object], node: Object) -> bool:
    """Every NoSchedule/NoExecute taint of the node (cordon included) is tolerated."""
    spec = node.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    taints = [t for t in sublist(spec, "taints") if isinstance(t, Mapping)]
    if spec.get("unschedulable") is True:
        taints.append(UNSCHEDULABLE_TAINT)
    held = [t for t in tolerations if isinstance(t, Mapping)]
    return all(
        any(tolerates(t, taint) for t in held)
        for taint in taints
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def fits(node: Object, needs: Mapping[str, Decimal]) -> bool:
    """The node offers every requested GPU resource, enough of it for the pod."""
    return all(allocatable(node, name) >= max(count, Decimal(1)) for name, count in needs.items())


def eligible_nodes(
    spec: Object, nodes: Iterable[Object], needs: Mapping[str, Decimal], extra_tolerations: Sequence[Object] = ()
) -> list[Object]:
    """Nodes the pod could be scheduled to (or, with nodeName, run on)."""
    pinned = spec.get("nodeName")
    tolerations = [*(sublist(spec, "tolerations")), *extra_tolerations]
    return [
        node
        for node in nodes
        if isinstance(node, Mapping)
        and (not pinned or node_name(node) == pinned)
        and affinity_matches(spec, node)
        and taints_tolerated(tolerations, node)
        and fits(node, needs)
    ]


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None



def label_values(spec: Object, key: str) -> frozenset[str] | None:
    """The values of node label ``key`` the pod confines itself to; None when it does not.

    nodeSelector and required node affinity (terms ORed, ``In`` expressions
    of one term intersected) both count; any term without an ``In`` on the
    key leaves the pod free.
    """
    selector = spec.get("nodeSelector")
    pinned = frozenset({str(selector[key])}) if isinstance(selector, Mapping) and key in selector else None
    terms = lookup(spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"))
    allowed: frozenset[str] | None = None
    if isinstance(terms, list) and terms:
        allowed = frozenset()
        for term in terms:
            values = _term_values(term, key)
            if values is None:
                allowed = None
                break
            allowed |= values
    if pinned is None or allowed is None:
        return pinned if allowed is None else allowed
    return pinned & allowed


def _term_values(term: Any, key: str) -> frozenset[str] | None:
    found: frozenset[str] | None = None
    exprs = term.get("matchExpressions") if isinstance(term, Mapping) else None
    for expr in exprs if isinstance(exprs, list) else ():
        if isinstance(expr, Mapping) and expr.get("key") == key and expr.get("operator") == "In":
            values = frozenset(str(v) for v in _list(expr.get("values")))
            found = values if found is None else found & values
    return found


def _list(value: Any) -> list[Any]:
    """A list field of a spec, [] when absent or not a list (untyped custom resources)."""
    return value if isinstance(value, list) else []

"""Which nodes a pod spec could land on, as the scheduler's filters decide.

Checked: ``spec.nodeName``; ``nodeSelector``; required node affinity (terms
ORed, expressions ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt, and
matchFields on metadata.name); NoSchedule/NoExecute taints against the
pod's tolerations; and the GPU resources in the node's allocatable.

Not checked: what changes by the second — free capacity, pod (anti-)affinity,
topology spread, and the node's current condition. The condition taints
(``node.kubernetes.io/not-ready``, ``unreachable``, ``*-pressure``,
``network-unavailable``, ``unschedulable``) and a cordon are set and lifted
by the node lifecycle controller and by operators as a node's state changes;
they say nothing about what the node can run once it is back. A NotReady blip
or a node pool still coming up must not make a node ineligible, or every
check that asks "which nodes could run this" would switch itself off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from webhook.gpu import cuda
from webhook.kube import dra
from webhook.kube.patch import lookup, sublist
from webhook.kube.value_text import text
from webhook.view import nodegroups

Object = Mapping[str, Any]

CONDITION_TAINTS = nodegroups.CONDITION_TAINTS
node_name = nodegroups.name_of
#: the node's labels as served (not copied: this runs for every group or node on every request)
node_labels = nodegroups.labels_of


#: one node-selector requirement, read once: (key, operator, values as strings)
Requirement = tuple[str, Any, list[str]]


def _requirement(expr: Object) -> Requirement:
    return text(expr.get("key", "")), expr.get("operator"), [text(v) for v in _list(expr.get("values"))]


def _holds(requirement: Requirement, labels: Mapping[str, Any]) -> bool:
    key, op, values = requirement
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


#: a nodeSelectorTerm, read once: (label requirements, field requirements); None matches nothing
Term = tuple[list[Requirement], list[Requirement]] | None


def _term(term: Any) -> Term:
    if not isinstance(term, Mapping):
        return None
    exprs = [_requirement(e) for e in sublist(term, "matchExpressions") if isinstance(e, Mapping)]
    fields = [_requirement(f) for f in _list(term.get("matchFields")) if isinstance(f, Mapping)]
    return (exprs, fields) if exprs or fields else None  # an empty term matches nothing


def _term_admits(term: Term, labels: Mapping[str, Any], name: str) -> bool:
    if term is None:
        return False
    exprs, fields = term
    if not all(_holds(e, labels) for e in exprs):
        return False
    return not fields or all(_holds(f, {"metadata.name": name}) for f in fields)


#: a toleration, read once: (effect, key, operator, value), with Kubernetes' defaults (operator Equal, value "")
Toleration = tuple[Any, Any, Any, Any]


def _toleration(toleration: Object) -> Toleration:
    return (toleration.get("effect"), toleration.get("key"), toleration.get("operator") or "Equal",
            toleration.get("value") or "")


def _taints_tolerated(held: list[Toleration], taints: Iterable[Object]) -> bool:
    """Every taint tolerated by one of ``held``, as Kubernetes' ToleratesTaint decides: an empty effect or key
    of the toleration matches any (tolerations read once: this runs per node group; tests/test_node_filter.py
    holds it to a per-node reference)."""
    for taint in taints:
        taint_effect, taint_key = taint.get("effect"), taint.get("key")
        for effect, key, operator, value in held:
            if (effect and effect != taint_effect) or (key and key != taint_key):
                continue
            if operator == "Exists" or (operator == "Equal" and value == (taint.get("value") or "")):
                break
        else:
            return False
    return True


_ZERO = Decimal(0)


class Placement(NamedTuple):
    """Nodes alike for the filter and the node rules: one of them, how many, and their driver."""

    node: Object
    nodes: int  # how many nodes it stands for
    driver: cuda.DriverVersion | None
    #: the GPU product its DRA devices name ("" when none does; GFD's label is on the node)
    device_product: str = ""


class NodeFilter:
    """What a pod spec asks of a node, read once and then checked against each node.

    The scheduler's filters as the module docstring lists them; a cluster has
    thousands of nodes, so nothing about the pod is worked out per node.
    """

    def __init__(
        self, spec: Object, needs: Mapping[str, Decimal], extra_tolerations: Sequence[Object] = (),
        devices: dra.Alternatives[tuple[str, str]] | None = None,
    ) -> None:
        #: DRA devices the pod's claims may take on its node: per request its alternatives as
        #: ((driver, type), devices); only nodes publishing one choice of them all in ResourceSlices
        #: admit it (None: the pod's claims are not checked)
        self.devices = devices
        self.pinned = spec.get("nodeName")
        selector = spec.get("nodeSelector")
        self.selector = [(text(k), text(v)) for k, v in selector.items()] if isinstance(selector, Mapping) else []
        required = lookup(spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"))
        #: None: no required node affinity; otherwise the terms (ORed), [] when there are none
        self.terms: list[Term] | None = None
        if isinstance(required, Mapping):
            terms = required.get("nodeSelectorTerms")
            self.terms = [_term(t) for t in terms] if isinstance(terms, list) else []
        held = [*sublist(spec, "tolerations"), *extra_tolerations]
        self.tolerations = [_toleration(t) for t in held if type(t) is dict or isinstance(t, Mapping)]
        self.needs = [(name, max(count, Decimal(1))) for name, count in needs.items()]
        #: the pod asks about something that differs from node to node within a group
        self.per_node = bool(self.pinned) or _per_node(self.selector, self.terms, self.needs)

    def tolerates(self, taint: Object) -> bool:
        """Whether the pod's tolerations (with the extra ones) tolerate ``taint``."""
        return _taints_tolerated(self.tolerations, (taint,))

    def admits(self, node: Any) -> bool:
        if not isinstance(node, Mapping):
            return False
        name = node_name(node)
        if self.pinned and name != self.pinned:
            return False
        if not self._labels_fit(node_labels(node), name):
            return False
        if not _taints_tolerated(self.tolerations, nodegroups.blocking_taints(node)):
            return False
        return all(nodegroups.amount(node, resource) >= count for resource, count in self.needs)

    def _labels_fit(self, labels: Mapping[str, Any], name: str) -> bool:
        for key, value in self.selector:
            if labels.get(key) != value:
                return False
        return self.terms is None or any(_term_admits(t, labels, name) for t in self.terms)

    def _group_admits(self, traits: nodegroups.Traits) -> bool:
        """admits() on what a group's members share (read once per group, not per request)."""
        if not self._labels_fit(traits.labels, ""):
            return False
        if not _taints_tolerated(self.tolerations, traits.taints):
            return False
        amounts = traits.amounts
        for resource, count in self.needs:
            if amounts.get(resource, _ZERO) < count:
                return False
        return self._devices_fit(traits)

    def _devices_fit(self, traits: nodegroups.Traits) -> bool:
        published = traits.devices
        return self.devices is None or dra.fitting(self.devices, lambda kind: published.get(kind, 0)) is not None

    def select(self, nodes: Iterable[Object]) -> list[Object]:
        return [node for node in nodes if self.admits(node)]

    def placements(self, groups: Iterable[nodegroups.NodeGroup]) -> list[Placement]:
        """Every kind of node the pod could land on: (node, how many such nodes, their driver).

        A whole group answers through its shape (the count is its size)
        unless the pod asks about what differs per node; then each admitted
        member answers for itself, with count 1.
        """
        if not self.per_node:
            return [Placement(g.shape, len(g.members), g.traits.driver, g.traits.device_product)
                    for g in groups if self._group_admits(g.traits)]
        # a member's driver and devices are its group's (both are part of the group's key)
        if self.pinned:
            pinned = nodegroups.member(groups, text(self.pinned))
            found = [pinned] if pinned is not None else []
        else:
            found = [(g, node) for g in groups for node in g.members.values()]
        return [Placement(n, 1, g.traits.driver, g.traits.device_product)
                for g, n in found if self._devices_fit(g.traits) and self.admits(n)]


def eligible_nodes(
    spec: Object, nodes: Iterable[Object], needs: Mapping[str, Decimal], extra_tolerations: Sequence[Object] = ()
) -> list[Object]:
    """Nodes the pod could be scheduled to (or, with nodeName, run on)."""
    return NodeFilter(spec, needs, extra_tolerations).select(nodes)


def _per_node(selector: list[tuple[str, str]], terms: list[Term] | None, needs: list[tuple[str, Decimal]]) -> bool:
    if any(key in nodegroups.PER_NODE_LABELS for key, _ in selector):
        return True
    if any(not nodegroups.is_extended(name) for name, _ in needs):
        return True
    for term in terms or ():
        if term is not None and (term[1] or any(key in nodegroups.PER_NODE_LABELS for key, _, _ in term[0])):
            return True
    return False


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
    pinned = frozenset({text(selector[key])}) if isinstance(selector, Mapping) and key in selector else None
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
            values = frozenset(text(v) for v in _list(expr.get("values")))
            found = values if found is None else found & values
    return found


def _list(value: Any) -> list[Any]:
    """A list field of a spec, [] when absent or not a list (untyped custom resources)."""
    return value if isinstance(value, list) else []

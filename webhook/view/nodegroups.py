"""Nodes grouped by everything the node filter and the node rules read of them.

Thousands of GPU nodes are a few dozen kinds of node: a pool shares its GPU
model, driver, taints and allocatable GPUs. Rules that ask "which nodes could
this pod land on, and what drivers do they run" check each group once.

A group's key is what :class:`webhook.view.scheduling.NodeFilter` and the
node rules can tell apart, less what differs on every node:

- the labels, except :data:`PER_NODE_LABELS` (hostname, GFD's timestamp...);
- the NoSchedule/NoExecute taints, except the condition taints (the filter
  ignores those, so a NotReady node stays in its pool's group);
- the names of the allocatable resources, and the amounts of the extended
  ones (names with a ``/``: GPUs, MIG slices; not cpu or memory, which
  differ by a few KiB from node to node);
- the devices DRA drivers publish on it in ResourceSlices, per driver and
  type, and the GPU driver version they report
  (:class:`webhook.view.node_devices.NodeDevices`).

A group answers through its ``shape``, a node object made of that key, and
knows its members by name. A pod whose constraints read what differs per node
(``nodeName``, ``matchFields``, a per-node label, a resource without a ``/``)
is checked member by member (``scheduling.NodeFilter.placements``): the answer
is exact either way, only its cost changes. A label that differs on every
node and is missing from :data:`PER_NODE_LABELS` costs speed, never
correctness: each node becomes a group of its own.

Values that are not strings (hand-written snapshot files) are keyed with
their type, so that ``8`` and ``"8"``, which the filter tells apart, never
share a group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhook.gpu import cuda
from webhook.kube import quantity
from webhook.view.node_devices import NodeDevices

Object = Mapping[str, Any]

#: labels set to a different value on every node: kept per member, not in the key
PER_NODE_LABELS: frozenset[str] = frozenset({
    "kubernetes.io/hostname",
    "nvidia.com/gfd.timestamp",
    "alpha.eksctl.io/instance-id",
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
})

#: taints that describe a node's current condition (kubernetes pkg/apis/core
#: well_known_taints.go), not what the node can run: the filter ignores them
CONDITION_TAINTS: frozenset[str] = frozenset(
    f"node.kubernetes.io/{key}"
    for key in ("not-ready", "unreachable", "unschedulable", "memory-pressure", "disk-pressure",
                "pid-pressure", "network-unavailable", "out-of-service")
)

Key = tuple[frozenset[Any], frozenset[Any], frozenset[Any], Any]


def name_of(node: Object) -> str:
    meta = node.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def labels_of(node: Object) -> Mapping[str, Any]:
    # type() first: isinstance against an ABC runs Python code, and this runs per node group per request
    meta = node.get("metadata")
    raw = meta.get("labels") if type(meta) is dict or isinstance(meta, Mapping) else None
    return raw if type(raw) is dict or isinstance(raw, Mapping) else {}


def is_extended(resource: str) -> bool:
    """Extended resources carry a domain (``nvidia.com/gpu``); cpu, memory, pods do not."""
    return "/" in resource


def blocking_taints(node: Object) -> list[Mapping[str, Any]]:
    """The taints that keep pods without a matching toleration off the node."""
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    return [
        t for t in (taints if isinstance(taints, list) else ())
        if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")
        and t.get("key") not in CONDITION_TAINTS
    ]


def allocatable(node: Object) -> Mapping[str, Any]:
    """The node's ``status.allocatable`` as it stands (no entry parsed); empty when it has none."""
    status = node.get("status")
    values = status.get("allocatable") if isinstance(status, Mapping) else None
    return values if isinstance(values, Mapping) else {}


def _h(value: Any) -> Any:
    return value if type(value) is str else (type(value).__name__, repr(value))


def key_of(node: Object, devices: NodeDevices | None = None) -> Key:
    labels = frozenset((_h(k), _h(v)) for k, v in labels_of(node).items() if k not in PER_NODE_LABELS)
    taints = frozenset((_h(t.get("key")), _h(t.get("value")), _h(t.get("effect"))) for t in blocking_taints(node))
    resources = frozenset(
        (_h(k), _h(v)) if isinstance(k, str) and is_extended(k) else _h(k) for k, v in allocatable(node).items()
    )
    return labels, taints, resources, devices.key if devices is not None else None


def shape_of(node: Object, devices: NodeDevices | None = None) -> dict[str, Any]:
    """The node as its group's key describes it: what every member shares."""
    labels = {k: v for k, v in labels_of(node).items() if k not in PER_NODE_LABELS}
    extended = {k: v for k, v in allocatable(node).items() if isinstance(k, str) and is_extended(k)}
    return {
        "metadata": {"labels": labels},
        "spec": {"taints": blocking_taints(node)},
        "status": {"allocatable": extended},
        # names of every allocatable resource, extended or not
        "resources": frozenset(allocatable(node)),
        "devices": devices,
    }


@dataclass(frozen=True, slots=True)
class Traits:
    """A group's shape, read once: what the filter and the node rules ask of it on every request."""

    labels: Mapping[str, Any]
    taints: list[Mapping[str, Any]]
    amounts: Mapping[str, Decimal]  # allocatable extended resources, parsed (invalid ones left out)
    #: the GPU driver: GFD's labels, else what the node's DRA devices report
    driver: cuda.DriverVersion | None
    #: devices published in ResourceSlices per (driver, type) and (driver, "") ({} when none)
    devices: Mapping[tuple[str, str], int]
    #: the GPU product its DRA devices name, GFD-spelled ("" when none does)
    device_product: str

    @classmethod
    def of(cls, shape: Mapping[str, Any]) -> Traits:
        labels = shape["metadata"]["labels"]
        parsed = {k: quantity.parse_quantity(v) for k, v in shape["status"]["allocatable"].items()}
        amounts = {k: v for k, v in parsed.items() if v is not None}
        devices: NodeDevices | None = shape.get("devices")
        driver = cuda.node_driver(labels) or (devices.driver if devices is not None else None)
        if devices is None:
            return cls(labels, shape["spec"]["taints"], amounts, driver, {}, "")
        return cls(labels, shape["spec"]["taints"], amounts, driver, devices.counts, devices.product)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Nodes alike in everything the filter reads of them but their name and per-node labels."""

    shape: Mapping[str, Any]
    traits: Traits
    members: Mapping[str, Object]  # by name; never changed once published
    last: str  # the greatest member name: messages name one node, as a max over (amount, name) does

    @property
    def labels(self) -> Mapping[str, Any]:
        return self.shape["metadata"]["labels"]  # type: ignore[no-any-return]

    def offers(self, resource: str) -> bool:
        """Some allocatable entry of this name (any amount) on every member."""
        return resource in self.shape["resources"]

    def largest(self, resource: str) -> tuple[Decimal, str]:
        """(largest allocatable amount of ``resource``, greatest name among the members with it)."""
        if is_extended(resource):
            return self.traits.amounts.get(resource, Decimal(0)), self.last
        return max(((amount(n, resource), name) for name, n in self.members.items()), default=(Decimal(0), ""))


def member(groups: Iterable[NodeGroup], name: str) -> tuple[NodeGroup, Object] | None:
    """The node named ``name`` and its group; None when no group has it."""
    return next(((g, g.members[name]) for g in groups if name in g.members), None)


def amount(node: Object, resource: str) -> Decimal:
    """How many of ``resource`` the node can give pods (0 when it has none)."""
    value = quantity.parse_quantity(allocatable(node).get(resource))
    return value if value is not None else Decimal(0)


class NodeGroups:
    """The groups of a changing set of nodes; one change costs O(size of the touched groups).

    Written by one thread at a time (the caller serialises); ``groups`` is
    republished whole after each change, so readers take no lock.
    """

    def __init__(self, nodes: Iterable[Object] = ()) -> None:
        self._key_of: dict[str, Key] = {}
        self._groups: dict[Key, NodeGroup] = {}
        self.groups: tuple[NodeGroup, ...] = ()
        self.replace(nodes)

    def replace(self, nodes: Iterable[Object], devices_of: Callable[[str], NodeDevices | None] | None = None) -> None:
        """All nodes anew; ``devices_of`` gives a node's published devices by name."""
        members: dict[Key, dict[str, Object]] = {}
        key_of_name: dict[str, Key] = {}
        devices: dict[Key, NodeDevices | None] = {}
        for node in nodes:
            if not isinstance(node, Mapping):
                continue
            name = name_of(node)
            published = devices_of(name) if devices_of is not None else None
            key = key_of(node, published)
            old = key_of_name.get(name)
            if old is not None:  # a name twice (snapshot files): the later object wins
                members[old].pop(name)
            key_of_name[name] = key
            members.setdefault(key, {})[name] = node
            devices[key] = published
        self._key_of = key_of_name
        self._groups = {k: _group(next(iter(m.values())), m, devices[k]) for k, m in members.items() if m}
        self.groups = tuple(self._groups.values())

    def put(self, node: Object, devices: NodeDevices | None = None) -> None:
        """Add or regroup a node (with the devices its ResourceSlices publish)."""
        name, key = name_of(node), key_of(node, devices)
        old = self._key_of.get(name)
        if old is not None and old != key:
            self._remove(old, name)
        group = self._groups.get(key)
        if group is None:
            self._groups[key] = _group(node, {name: node}, devices)
        else:
            self._groups[key] = NodeGroup(group.shape, group.traits, {**group.members, name: node}, max(group.last, name))
        self._key_of[name] = key
        self.groups = tuple(self._groups.values())

    def discard(self, name: str) -> None:
        key = self._key_of.pop(name, None)
        if key is not None:
            self._remove(key, name)
            self.groups = tuple(self._groups.values())

    def _remove(self, key: Key, name: str) -> None:
        group = self._groups[key]
        members = {k: v for k, v in group.members.items() if k != name}
        if not members:
            del self._groups[key]
            return
        self._groups[key] = NodeGroup(group.shape, group.traits, members, max(members) if name == group.last else group.last)


def _group(node: Object, members: Mapping[str, Object], devices: NodeDevices | None) -> NodeGroup:
    shape = shape_of(node, devices)
    return NodeGroup(shape, Traits.of(shape), members, max(members))

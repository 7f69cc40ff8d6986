"""What DRA drivers publish on each node (its ResourceSlices), summed up for the node groups.

A node's devices decide, as its labels and allocatable do, which pods it
can run: a pod whose GPUs come from claims lands only where a driver
publishes enough devices of their classes, and the GPU driver version the
devices report (``driverVersion``) stands in for GPU Feature Discovery's
labels on nodes without them. :class:`SliceIndex` keeps, per node, the
devices of its node-local slices; :class:`webhook.view.aggregates.Aggregates`
puts each node's :class:`NodeDevices` into its node group's key, so a slice
event regroups one node and an admission reads a few dozen groups, never
every device of the cluster.

Slices without ``nodeName`` (devices reachable from several nodes) are not
per-node devices and are not counted per node; every device is found by the
(driver, pool, name) a claim's allocation result gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.gpu import products
from webhook.gpu.cuda import DriverVersion
from webhook.gpu.device_classes import GPU_DRIVER
from webhook.kube.resource_slices import Device, slice_devices

Object = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """A node's published devices: how many per (driver, type) and per (driver, ""), and the GPU driver they report."""

    counts: Mapping[tuple[str, str], int]
    driver: DriverVersion | None  # the oldest GPU driver its devices report (they should agree)
    #: the GPUs' productName as GPU Feature Discovery spells it (dashes for spaces), "" when none says
    product: str = ""

    @property
    def key(self) -> tuple[frozenset[tuple[tuple[str, str], int]], DriverVersion | None, str]:
        """What tells this node's devices apart from another's (part of its node group's key)."""
        return frozenset(self.counts.items()), self.driver, self.product


def summarize(devices: Iterable[Device]) -> NodeDevices | None:
    """The devices of one node, summed up; None when there are none."""
    counts: dict[tuple[str, str], int] = {}
    driver: DriverVersion | None = None
    named: set[str] = set()
    for device in devices:
        kind = device.text("type") or ""
        counts[(device.driver, kind)] = counts.get((device.driver, kind), 0) + 1
        if kind:
            counts[(device.driver, "")] = counts.get((device.driver, ""), 0) + 1
        if device.driver != GPU_DRIVER:
            continue
        text = device.text("driverVersion")
        version = DriverVersion.parse(text) if text else None
        if version is not None and (driver is None or version < driver):
            driver = version
        product = device.text("productName")
        if product:
            named.add(products.label_value(product))
    # GPUs of several products on one node: none is named (forward compatibility is then not assumed)
    return NodeDevices(counts, driver, named.pop() if len(named) == 1 else "") if counts else None


def _name(obj: Object) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


class SliceIndex:
    """The node-local ResourceSlices of a changing cluster, by node.

    Written by one thread at a time (the caller serialises).
    """

    def __init__(self) -> None:
        self._slices: dict[str, tuple[str, tuple[Device, ...]]] = {}  # slice name → (node, its devices)
        self._on_node: dict[str, set[str]] = {}  # node → names of its slices
        self._summary: dict[str, NodeDevices | None] = {}  # node → its devices, worked out when asked
        #: every device by (driver, pool, name), node-local or not: what a claim's allocation names.
        #: Changed in place one key at a time by the writer, replaced whole on a relist; readers
        #: only look single keys up (atomic under the GIL)
        self._by_id: dict[tuple[str, str, str], Device] = {}

    def put(self, obj: Object) -> set[str]:
        """Add or replace a slice; the nodes whose devices changed."""
        name = _name(obj)
        touched = self._drop(name)
        devices = tuple(slice_devices(obj))
        if devices:
            node = devices[0].node
            self._slices[name] = (node, devices)
            for device in devices:
                self._by_id[(device.driver, device.pool, device.name)] = device
            if node:
                self._on_node.setdefault(node, set()).add(name)
                self._summary.pop(node, None)
                touched.add(node)
        return touched

    def device(self, driver: str, pool: str, name: str) -> Device | None:
        """A published device by the names a claim's allocation result gives."""
        return self._by_id.get((driver, pool, name))

    def discard(self, name: str) -> set[str]:
        """Remove a slice; the nodes whose devices changed."""
        return self._drop(name)

    def replace(self, objs: Iterable[Object]) -> None:
        """A relist: built aside and swapped in, so a reader of ``device`` (without the writer's
        lock) never sees the index half-built."""
        fresh = SliceIndex()
        for obj in objs:
            if isinstance(obj, Mapping):
                fresh.put(obj)
        self._slices, self._on_node, self._summary, self._by_id = fresh._slices, fresh._on_node, fresh._summary, fresh._by_id

    def of_node(self, node: str) -> NodeDevices | None:
        """The node's devices over all its slices (None: it publishes none)."""
        if node not in self._summary:
            names = self._on_node.get(node, ())
            self._summary[node] = summarize(d for name in sorted(names) for d in self._slices[name][1])
        return self._summary[node]

    def _drop(self, name: str) -> set[str]:
        old = self._slices.pop(name, None)
        if old is None:
            return set()
        node = old[0]
        for device in old[1]:
            key = (device.driver, device.pool, device.name)
            if self._by_id.get(key) is device:  # not republished by another slice meanwhile
                del self._by_id[key]
        if not node:
            return set()
        names = self._on_node.get(node, set())
        names.discard(name)
        if not names:
            self._on_node.pop(node, None)
        self._summary.pop(node, None)
        return {node}

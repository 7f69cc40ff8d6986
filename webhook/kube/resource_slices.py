"""ResourceSlices: the devices DRA drivers publish per node, and what their attributes say.

Kubernetes semantics (resource.k8s.io). A slice names its ``driver`` and, for
node-local devices, its ``nodeName``; each device has typed attributes
(``{"string": …}``, ``{"version": …}``, ``{"int": …}``, ``{"bool": …}``) whose
unqualified names belong to the driver's domain (``driverVersion`` is
``gpu.nvidia.com/driverVersion``). v1beta1 nests them under ``basic``.
NVIDIA's GPU driver publishes ``type``, ``productName``, ``driverVersion``,
``cudaDriverVersion`` … (webhook.gpu.device_classes cites the source).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webhook.gpu.device_classes import DeviceClassInfo

if TYPE_CHECKING:  # the view's aggregates read slices through this module
    from webhook.view.snapshot import ClusterView

@dataclass(frozen=True)
class Device:
    """One published device: where it is and what its attributes say."""

    node: str  # "" for devices not bound to one node
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]

    def text(self, attribute_name: str) -> str | None:
        return attribute(self.attributes, attribute_name, self.driver)


def devices(view: ClusterView) -> list[Device]:
    """Every device of the view's ResourceSlices."""
    return [device for obj in view.resource_slices() for device in slice_devices(obj)]


def slice_devices(obj: Mapping[str, Any]) -> list[Device]:
    """The devices one ResourceSlice publishes."""
    spec = _map(obj.get("spec"))
    node, driver = str(spec.get("nodeName") or ""), str(spec.get("driver") or "")
    pool = str(_map(spec.get("pool")).get("name") or "")
    found: list[Device] = []
    raw_devices = spec.get("devices")
    for device in raw_devices if isinstance(raw_devices, list) else ():
        raw = _map(device)
        attributes = _map(raw.get("attributes")) or _map(_map(raw.get("basic")).get("attributes"))
        found.append(Device(node, driver, pool, str(raw.get("name") or ""), attributes))
    return found


def allocated(view: ClusterView, results: list[Any]) -> list[Device]:
    """The devices a claim's ``status.allocation.devices.results`` name (those the view has): a lookup each."""
    found = (view.published_device(str(_map(r).get("driver")), str(_map(r).get("pool")), str(_map(r).get("device")))
             for r in results)
    return [d for d in found if d is not None]


def attribute(attributes: Mapping[str, Any], name: str, domain: str) -> str | None:
    """A device attribute's value as text; unqualified names belong to the driver's domain."""
    value = attributes.get(name, attributes.get(f"{domain}/{name}"))
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def of_class(device: Device, info: DeviceClassInfo) -> bool:
    """Is this device one of the class's (its driver, and its ``type`` when the class names one)?"""
    if device.driver != info.driver:
        return False
    return not info.device_type or device.text("type") == info.device_type


def largest_node_count(view: ClusterView, info: DeviceClassInfo) -> int:
    """The most devices of this class one node publishes (1 when ResourceSlices are unknown)."""
    if not view.availability("resourceslices").known:
        return 1
    return max(1, largest_node(view, info)[0])


def largest_node(view: ClusterView, info: DeviceClassInfo) -> tuple[int, str]:
    """(devices, node) of the node publishing the most devices of this class; (0, "") when none does.

    Read from the node groups, whose key holds each node's published devices
    (webhook.view.node_devices): a lookup per group, not a scan of every
    device. Without the nodes (a snapshot of ResourceSlices alone) the
    devices are counted per ``nodeName``.
    """
    if view.availability("nodes").known:
        kind = (info.driver, info.device_type)
        return max(((n, g.last) for g in view.node_groups() if (n := g.traits.devices.get(kind, 0))), default=(0, ""))
    per_node: dict[str, int] = {}
    for device in devices(view):
        if device.node and of_class(device, info):
            per_node[device.node] = per_node.get(device.node, 0) + 1
    return max(((n, node) for node, n in per_node.items()), default=(0, ""))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}

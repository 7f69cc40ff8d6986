"""The devices the cluster's ResourceSlices publish, as the cluster view answers for them.

Which node publishes the most devices of a class, and which devices a
claim's allocation names: read through the view (its node groups when it has
the nodes), never by a scan of every slice on an admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube.resource_slices import Device, slice_devices
from webhook.view.protocol import ClusterView


def devices(view: ClusterView) -> list[Device]:
    """Every device of the view's ResourceSlices."""
    return [device for obj in view.resource_slices() for device in slice_devices(obj)]


def allocated(view: ClusterView, results: list[Any]) -> list[Device]:
    """The devices a claim's ``status.allocation.devices.results`` name (those the view has): a lookup each."""
    found = (view.published_device(str(_map(r).get("driver")), str(_map(r).get("pool")), str(_map(r).get("device")))
             for r in results)
    return [d for d in found if d is not None]


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

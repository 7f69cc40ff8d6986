"""ResourceSlices: the devices DRA drivers publish per node, and what their attributes say.

Kubernetes semantics (resource.k8s.io). A slice names its ``driver`` and, for
node-local devices, its ``nodeName``; each device has typed attributes
(``{"string": …}``, ``{"version": …}``, ``{"int": …}``, ``{"bool": …}``) whose
unqualified names belong to the driver's domain (``driverVersion`` is
``gpu.nvidia.com/driverVersion``). v1beta1 nests them under ``basic``.
NVIDIA's GPU driver publishes ``type``, ``productName``, ``driverVersion``,
``cudaDriverVersion`` … (webhook.gpu.device_classes cites the source).
What the cluster view answers from them is :mod:`webhook.view.devices`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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


def attribute(attributes: Mapping[str, Any], name: str, domain: str) -> str | None:
    """A device attribute's value as text; unqualified names belong to the driver's domain."""
    value = attributes.get(name, attributes.get(f"{domain}/{name}"))
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}

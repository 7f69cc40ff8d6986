"""DRA device classes that hand out GPUs, and the extended resource each counts as.

GPU knowledge, as data. With Dynamic Resource Allocation a pod asks for
devices of a DeviceClass through a ResourceClaim; every rule of this engine
(tolerations, quotas, shape, CUDA) speaks of GPUs by extended resource name.
So a GPU request of a claim counts as the extended resource the same GPU
would be under NVIDIA's device plugin: one ``gpu.nvidia.com`` device is one
``nvidia.com/gpu``, one ``mig.nvidia.com`` device of profile 1g.10gb is one
``nvidia.com/mig-1g.10gb``. A cap on ``nvidia.com/gpu`` then counts both.

Sources (NVIDIA/k8s-dra-driver-gpu, deployments/helm/…/templates/deviceclass-*.yaml,
cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go):

- ``gpu.nvidia.com``: full GPUs (``device.attributes['gpu.nvidia.com'].type == 'gpu'``);
  on resource.k8s.io/v1 the class also declares ``extendedResourceName: nvidia.com/gpu``;
- ``mig.nvidia.com``: MIG devices (type ``mig``), attribute ``profile`` (e.g. ``1g.10gb``);
- ``vfio.gpu.nvidia.com``: full GPUs passed through to VMs (type ``vfio``);
- ``compute-domain-*.nvidia.com``: IMEX daemons and channels, not GPUs (not listed).

Device attributes a driver publishes in ResourceSlices: ``productName``
("NVIDIA A100-SXM4-80GB"), ``architecture``, ``driverVersion`` and
``cudaDriverVersion`` (versions), ``cudaComputeCapability``, ``uuid``,
and for MIG ``profile`` and ``parentUUID``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.gpu import mig

#: the DRA driver of NVIDIA's GPUs (its devices' attribute domain), whose devices report ``driverVersion``
GPU_DRIVER = "gpu.nvidia.com"
#: placeholder in a resource pattern, filled with the MIG profile a request selects
PROFILE = "{profile}"
#: what a MIG request counts as when its selectors name no profile
ANY_PROFILE = "any"


@dataclass(frozen=True)
class DeviceClassInfo:
    """A device class whose devices are GPUs, and what one device counts as."""

    name: str
    resource: str  # an extended resource name; ``{profile}`` is filled from the request
    driver: str = GPU_DRIVER  # the DRA driver publishing its devices (their attribute domain)
    device_type: str = ""  # the driver's ``type`` attribute of its devices; "": every device of the driver

    @property
    def is_mig(self) -> bool:
        return PROFILE in self.resource

    def counts_as(self, profile: str | None) -> str:
        """The extended resource one device of this class counts as."""
        if not self.is_mig:
            return self.resource
        return self.resource.replace(PROFILE, mig.resource_profile(profile) if profile else ANY_PROFILE)


#: NVIDIA's classes, the shipped default; policies add others (AMD, Intel) with spec.deviceClasses
DEFAULT_DEVICE_CLASSES: tuple[DeviceClassInfo, ...] = (
    DeviceClassInfo("gpu.nvidia.com", "nvidia.com/gpu", device_type="gpu"),
    DeviceClassInfo("mig.nvidia.com", f"nvidia.com/mig-{PROFILE}", device_type="mig"),
    DeviceClassInfo("vfio.gpu.nvidia.com", "nvidia.com/gpu", device_type="vfio"),
)


def table(extra: Iterable[DeviceClassInfo] = ()) -> dict[str, DeviceClassInfo]:
    """Class name → info; entries given later override the defaults."""
    return {c.name: c for c in (*DEFAULT_DEVICE_CLASSES, *extra)}


_DRIVER = re.compile(r"""device\.driver\s*==\s*['"]([^'"]+)['"]""")
_TYPE = re.compile(r"""device\.attributes\[\s*['"]([^'"]+)['"]\s*\]\.type\s*==\s*['"]([^'"]+)['"]""")


def derive(device_class: Mapping[str, Any], known: Mapping[str, DeviceClassInfo]) -> DeviceClassInfo | None:
    """A cluster's own DeviceClass (say ``h100.nvidia.com``, a cost or performance tier an admin
    defines) that selects the devices of a known GPU class: its selectors name that class's
    driver (and ``type``), or it declares that class's ``extendedResourceName``."""
    name = str((device_class.get("metadata") or {}).get("name") or "")
    raw = device_class.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    text = " && ".join(
        str(((s or {}).get("cel") or {}).get("expression") or "") for s in spec.get("selectors") or ()
        if isinstance(s, Mapping)
    )
    driver = _DRIVER.search(text)
    if driver is not None:
        types = {t for domain, t in _TYPE.findall(text) if domain == driver.group(1)}
        for info in known.values():
            if info.driver == driver.group(1) and (not types or info.device_type in types or not info.device_type):
                return replace(info, name=name)
    extended = spec.get("extendedResourceName")
    for info in known.values():
        if extended and info.resource == extended:
            return replace(info, name=name)
    return None

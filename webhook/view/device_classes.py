"""The DRA device classes of a cluster that hand out GPUs, as the engine looks them up.

The policies' own GPU device classes (:mod:`webhook.gpu.device_classes`), plus
the cluster's DeviceClasses that select the same devices, derived from them
when first asked and remembered for the rest of one evaluation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from webhook.gpu import device_classes
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.view.protocol import ClusterView


class ClusterClasses(Mapping[str, DeviceClassInfo]):
    """The policies' GPU device classes, plus the cluster's own classes that select the same devices
    (webhook.gpu.device_classes.derive); looked up in the view when asked, once per name."""

    def __init__(self, table: Mapping[str, DeviceClassInfo], view: ClusterView) -> None:
        self._table, self._view = table, view
        self._derived: dict[str, DeviceClassInfo | None] = {}

    def __getitem__(self, name: str) -> DeviceClassInfo:
        info = self._table.get(name)
        if info is None:
            if name not in self._derived:
                obj = self._view.device_class(name) if self._view.availability("deviceclasses").known else None
                self._derived[name] = device_classes.derive(obj, self._table) if obj is not None else None
            info = self._derived[name]
        if info is None:
            raise KeyError(name)
        return info

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

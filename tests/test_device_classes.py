"""A cluster's own DRA DeviceClasses that select GPUs, as one admission looks them up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.support import shipped_policies
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.protocol import Object
from webhook.view.snapshot import SnapshotView


@dataclass(frozen=True)
class CountingView(SnapshotView):
    """A snapshot that counts how often each DeviceClass is asked for."""

    asked: dict[str, int] = field(default_factory=dict, compare=False)

    def device_class(self, name: str) -> Object | None:
        self.asked[name] = self.asked.get(name, 0) + 1
        return super().device_class(name)


TIER = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "h100.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                      "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "two", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "h100.example.com",
                                                                                   "count": 2}}]}}}}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
       "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "resources": {"claims": [{"name": "g"}]}}],
                "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "two"}]}}


def _slice(node: str, gpus: int) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "driverVersion": {"version": "535.104.5"},
                                                   "productName": {"string": "NVIDIA H100 80GB HBM3"}}}
               for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node}, "devices": devices}}


def test_a_claim_pods_device_classes_are_looked_up_once_per_admission() -> None:
    """The claims' resolution and the rules (CUDA's devices per node, DRA node capacity) share one lookup."""
    node = {"kind": "Node", "metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "n"}}}
    view = CountingView.from_objects([TIER, TEMPLATE, node, _slice("n", 1)])
    assert isinstance(view, CountingView)
    decision = engine.evaluate(shipped_policies(), Request.for_object(POD), view, "validate")
    # the cluster's class counts as NVIDIA's GPUs: two of them fit no node that publishes one
    assert "claims 2 h100.example.com devices in one pod, more than any node publishes" in decision.message()
    assert view.asked == {"h100.example.com": 1}

"""Quota usage from pods as the server's cluster index keeps them (trimmed)."""

from __future__ import annotations

from typing import Any

from tests.support import POLICIES
from webhook.cluster.pods import trim_pod
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: caps}
spec:
  rules: {quota: {resourceQuotas: false, limits: [{max: 8}]}}
"""


def pod(name: str, gpus: int, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "managedFields": [{}], **meta},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase, "conditions": []},
    }


def test_trimmed_pods_keep_what_quota_usage_needs() -> None:
    policies = loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + POLICY)
    cluster = [
        pod("running", 4),
        pod("leaving", 2, deletionTimestamp="2025-01-01T00:00:00Z", deletionGracePeriodSeconds=30),
        pod("done", 8, phase="Succeeded"),
    ]
    view = SnapshotView.from_objects([trim_pod(p) for p in cluster])
    decision = engine.evaluate(policies, Request.for_object(pod("new", 2)), view, "validate")
    assert decision.allowed, decision.message()  # 4 + 2 + 2 of 8: the finished pod holds none
    decision = engine.evaluate(policies, Request.for_object(pod("new", 3)), view, "validate")
    # the Terminating pod holds its GPUs (a snapshot has no clock to see its grace period pass)
    assert "namespace ml uses 6 of 8 nvidia.com/gpu; this pod asks for 3" in decision.message()

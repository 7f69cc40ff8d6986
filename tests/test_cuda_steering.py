"""CUDA steering survives a rolling driver upgrade: a pod steered onto the capable drivers of today
still matches the nodes once they carry a newer driver (drivers are backward compatible)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.support import apply_patch, assert_schema_valid, shipped_policies
from webhook.kube import affinity
from webhook.kube.patch import PatchBuilder
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view import scheduling
from webhook.view.snapshot import SnapshotView

CUDA_1263 = "nvidia/cuda:12.6.3-runtime-ubuntu22.04"  # native minimum 560.35.05 (FACTS.md §1)


def _node(name: str, driver: str) -> dict[str, Any]:
    major, minor, rev = driver.split(".")
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
              "nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver-version.major": major,
              "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": rev}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def _pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": CUDA_1263,
                                     "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}]}}


def _steer(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[Any, ...]:
    return engine.evaluate(shipped_policies(), Request.for_object(pod), SnapshotView.from_objects(nodes), "mutate").patch


def test_a_steered_pending_pod_still_matches_its_nodes_after_a_driver_upgrade() -> None:
    pod = _pod()
    steered = apply_patch(pod, _steer(pod, [_node("old", "550.54.15"), _node("a", "570.124.06")]))
    assert_schema_valid(steered)
    upgraded = [_node("old", "550.54.15"), _node("a", "575.57.08"), _node("b", "570.133.20"),
                _node("same-branch-older", "560.35.03"), _node("same-branch-newer", "560.94.02")]
    eligible = scheduling.NodeFilter(steered["spec"], {"nvidia.com/gpu": Decimal(1)}).select(upgraded)
    assert sorted(scheduling.node_name(n) for n in eligible) == ["a", "b", "same-branch-newer"]
    view = SnapshotView.from_objects(upgraded)
    judged = engine.evaluate(shipped_policies(), Request.for_object(steered), view, "validate")
    assert judged.allowed and not [f for f in judged.findings if f.rule == "cudaDriver"], judged.findings
    # the reinvocation (or any later pass) against the upgraded fleet adds nothing
    assert _steer(steered, upgraded) == ()


def _merged(spec: dict[str, Any], alternatives: list[list[dict[str, Any]]]) -> tuple[affinity.Merge, Any]:
    builder = PatchBuilder({"spec": spec})
    merge = affinity.require_any(builder, ("spec",), alternatives)
    return merge, builder.get(("spec", *affinity.REQUIRED))


GT_550 = [{"key": "d.major", "operator": "Gt", "values": ["550"]}]
IN_A = [{"key": "d.full", "operator": "In", "values": ["550.54.15"]}]


def test_a_nodeselector_that_already_satisfies_an_alternative_is_left_alone() -> None:
    merge, terms = _merged({"nodeSelector": {"d.full": "550.54.15"}}, [IN_A, GT_550])
    assert not merge.added and terms is None


def test_a_term_gets_only_the_alternatives_it_does_not_contradict() -> None:
    term = {"matchExpressions": [{"key": "d.full", "operator": "In", "values": ["535.104.05"]}]}
    merge, terms = _merged({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}, [IN_A, GT_550])
    assert merge.added
    assert terms == [{"matchExpressions": [*term["matchExpressions"], *GT_550]}]

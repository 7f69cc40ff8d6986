"""GPU DaemonSets: their controller puts a pod on every node the template selects and tolerates,
bound to that node, whatever the pod asks for; the pods' own mutation cannot move them.

resourceShape (nodeCapacity) warns of the nodes a GPU DaemonSet reaches that cannot run its pods,
and of a template that tolerates none of the nodes with its GPUs; a Deployment (the control) is
placed by the scheduler, which skips such nodes, and gets neither warning.
"""

from __future__ import annotations

from typing import Any

from tests.support import shipped_policies
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _node(name: str, gpus: str | None, taints: list[dict[str, str]]) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true"} if gpus else {}
    allocatable = {"cpu": "32", "memory": "256Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints}, "status": {"allocatable": allocatable}}


#: what the new user's cluster had: two tainted GPU nodes and an untainted CPU node
NODES = [_node("a100-1", "8", [GPU_TAINT]), _node("t4-1", "4", [GPU_TAINT]), _node("cpu-1", None, [])]


def _workload(kind: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/tools:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "w"}},
                     "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [container], **spec}}}}


def _shape_messages(obj: dict[str, Any], nodes: list[dict[str, Any]] = NODES) -> tuple[bool, list[str]]:
    judged = engine.evaluate(shipped_policies(), Request.for_object(obj), SnapshotView.from_objects(nodes), "validate")
    return judged.allowed, [f.message for f in judged.findings if f.rule == "resourceShape"]


def test_a_gpu_daemon_set_without_the_toleration_is_warned_of_both_halves() -> None:
    allowed, [warning] = _shape_messages(_workload("DaemonSet"))
    assert allowed  # a warning: on a cluster whose GPU nodes carry no taint, such a DaemonSet works
    assert warning == ("DaemonSet ml/w spec.template: its pods reach 1 of 1 node(s) without 1 nvidia.com/gpu "
                       "(cpu-1: Pending) and none of the 2 with it: tolerate nvidia.com/gpu:NoSchedule, "
                       "select nvidia.com/gpu.present=true"), warning
    # one warning, within the 256 characters kube-apiserver keeps of one, with the policy and rule before it
    assert len(f"[gpu-validations/resourceShape] {warning}") <= 256
    # control: a Deployment's pods are placed by the scheduler (and given the toleration when made)
    assert _shape_messages(_workload("Deployment")) == (True, [])


def test_a_gpu_daemon_set_that_tolerates_the_gpu_nodes_is_warned_of_the_cpu_node_it_also_reaches() -> None:
    allowed, [warning] = _shape_messages(_workload("DaemonSet", tolerations=[GPU_TOLERATION]))
    assert allowed and warning.endswith(
        "its pods reach 1 of 3 node(s) without 1 nvidia.com/gpu (cpu-1: Pending): select nvidia.com/gpu.present=true"), warning


def test_a_gpu_daemon_set_that_selects_the_gpu_nodes_without_tolerating_them_is_told_the_toleration() -> None:
    allowed, [warning] = _shape_messages(_workload("DaemonSet", nodeSelector={"nvidia.com/gpu.present": "true"}))
    assert allowed and warning.endswith(
        "its pods reach none of the 2 node(s) with 1 nvidia.com/gpu: tolerate nvidia.com/gpu:NoSchedule"), warning


def test_a_gpu_daemon_set_placed_on_the_gpu_nodes_is_not_warned() -> None:
    placed = _workload("DaemonSet", tolerations=[GPU_TOLERATION], nodeSelector={"nvidia.com/gpu.present": "true"})
    assert _shape_messages(placed) == (True, [])
    # on a cluster of untainted GPU nodes only, even the bare DaemonSet is right
    untainted = [_node(f"gpu-{i}", "8", []) for i in range(3)]
    assert _shape_messages(_workload("DaemonSet"), untainted) == (True, [])


def test_a_cluster_of_many_alike_nodes_is_counted_by_node() -> None:
    # nodes alike are one group to the filter (webhook.view.nodegroups): counts and the example name hold
    fleet = [_node(f"cpu-{i:02}", None, []) for i in range(40)] + [_node(f"gpu-{i:02}", "8", [GPU_TAINT]) for i in range(60)]
    allowed, [warning] = _shape_messages(_workload("DaemonSet"), fleet)
    assert allowed and "reach 40 of 40 node(s) without 1 nvidia.com/gpu (cpu-" in warning, warning
    assert "and none of the 60 with it" in warning, warning


def test_only_the_taints_the_template_does_not_tolerate_are_named() -> None:
    taints = [{"key": k, "effect": "NoSchedule"} for k in ("a.example/one", "b.example/two", "z.example/dedicated")]
    tolerated = [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in ("a.example/one", "b.example/two")]
    placed = _workload("DaemonSet", tolerations=tolerated, nodeSelector={"nvidia.com/gpu.present": "true"})
    allowed, [warning] = _shape_messages(placed, [_node("gpu-1", "8", taints), _node("cpu-1", None, [])])
    assert allowed and warning.endswith("none of the 1 node(s) with 1 nvidia.com/gpu: tolerate z.example/dedicated:NoSchedule"), warning


def test_a_template_that_selects_the_gpu_nodes_already_is_told_to_select_by_what_it_asks() -> None:
    # eight GPUs each: the 4-GPU node has the label too, so the label would not keep the pod off it
    placed = _workload("DaemonSet", tolerations=[GPU_TOLERATION], nodeSelector={"nvidia.com/gpu.present": "true"})
    placed["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    allowed, [warning] = _shape_messages(placed, [_node("a100-1", "8", [GPU_TAINT]), _node("t4-1", "4", [GPU_TAINT])])
    assert allowed and warning.endswith(
        "its pods reach 1 of 2 node(s) without 8 nvidia.com/gpu (t4-1: Pending): select only nodes with 8 nvidia.com/gpu"), warning

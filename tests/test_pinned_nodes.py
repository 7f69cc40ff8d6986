"""GPU pods pinned to a node by ``spec.nodeName``: they skip the scheduler, and the node's kubelet fails
a pod whose resources it cannot give (``OutOf<resource>``), at once; a template's controller then makes
another, and another. resourceShape (nodeCapacity) refuses what the named node cannot give; the control,
the same pod pinned to a node with its GPUs, is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import shipped_policies
from tests.test_daemon_sets import GPU_TAINT, _node
from webhook import review
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

#: a GPU node with 8, one with 4, a CPU node, a GPU node whose device plugin has not registered yet, and a
#: node whose GPUs are all split into MIG slices
NODES = [_node("a100-1", "8", [GPU_TAINT]), _node("t4-1", "4", [GPU_TAINT]), _node("cpu-1", None, []),
         {**_node("h100-new", None, []), "metadata": {"name": "h100-new", "labels": {"nvidia.com/gpu.present": "true"}}},
         {**_node("mig-1", "0", [GPU_TAINT]), "status": {"allocatable": {"cpu": "32", "nvidia.com/gpu": "0",
                                                                         "nvidia.com/mig-1g.10gb": "7"}}}]


def _pod(node: str, gpus: str = "1", resource: str = "nvidia.com/gpu", **meta: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/train:1", "resources": {"limits": {resource: gpus}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", **meta},
            "spec": {"nodeName": node, "containers": [container]}}


def _judged(obj: dict[str, Any], nodes: list[dict[str, Any]] = NODES) -> tuple[bool, list[tuple[str, str]]]:
    judged = engine.evaluate(shipped_policies(), Request.for_object(obj), SnapshotView.from_objects(nodes), "validate")
    return judged.allowed, [(f.mode, f.message) for f in judged.findings if f.rule == "resourceShape"]


def test_a_gpu_pod_pinned_to_a_node_without_gpus_is_refused_with_what_to_do() -> None:
    allowed, [(mode, message)] = _judged(_pod("cpu-1"))
    assert not allowed and mode == "enforce"
    assert message == ("Pod ml/p: its kubelet fails it (OutOfnvidia.com/gpu): its node offers 0 of the 1 nvidia.com/gpu it "
                       "asks for; remove spec.nodeName, or name a node with them instead of cpu-1")
    # control: pinned to a node with the GPUs, nothing to say
    assert _judged(_pod("a100-1")) == (True, [])


def test_more_gpus_than_the_pinned_node_offers_are_refused_though_another_node_has_them() -> None:
    allowed, [(_, message)] = _judged(_pod("t4-1", "8"))
    assert not allowed and message.endswith("offers 4 of the 8 nvidia.com/gpu it asks for; remove spec.nodeName, or name "
                                            "a node with them instead of t4-1")
    # control: the same pod unpinned fits the largest node (8): the scheduler finds it
    unpinned = _pod("t4-1", "8")
    del unpinned["spec"]["nodeName"]
    assert _judged(unpinned) == (True, [])


def test_a_template_pinned_to_a_node_without_gpus_is_refused_too() -> None:
    pod = _pod("cpu-1")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ml"},
                  "spec": {"selector": {"matchLabels": {"app": "d"}},
                           "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod["spec"]}}}
    allowed, [(_, message)] = _judged(deployment)
    assert not allowed and message.startswith("Deployment ml/d spec.template: its kubelet fails it (OutOfnvidia.com/gpu): "
                                              "its node offers 0") and message.endswith("instead of cpu-1")


@pytest.mark.parametrize("node", ["no-such-node", ""])
def test_a_node_the_view_does_not_know_is_left_to_its_kubelet(node: str) -> None:
    assert _judged(_pod(node)) == (True, [])
    # what is still judged: more than the largest node offers (8)
    allowed, [(_, message)] = _judged(_pod(node, "16"))
    assert not allowed and "more than any node offers (largest: 8 on a100-1)" in message


def test_whole_gpus_on_a_node_of_mig_slices_and_slices_on_a_node_of_whole_gpus_are_refused() -> None:
    # the node has GPUs and its device plugin runs: it will never offer what the pod asks for
    allowed, [(mode, message)] = _judged(_pod("mig-1"))
    assert not allowed and mode == "enforce" and "offers 0 of the 1 nvidia.com/gpu" in message and message.endswith("mig-1")
    allowed, [(mode, message)] = _judged(_pod("a100-1", resource="nvidia.com/mig-1g.10gb"))
    assert not allowed and mode == "enforce" and "offers 0 of the 1 nvidia.com/mig-1g.10gb" in message and message.endswith("a100-1")
    # control: a slice on the node of slices
    assert _judged(_pod("mig-1", resource="nvidia.com/mig-1g.10gb")) == (True, [])


def test_a_gpu_node_whose_device_plugin_has_not_registered_is_only_warned_of() -> None:
    allowed, [(mode, message)] = _judged(_pod("h100-new"))
    assert allowed and mode == "warn" and message == (
        "Pod ml/p: its kubelet fails it (OutOfnvidia.com/gpu) until the device plugin of its spec.nodeName registers GPUs: h100-new")
    # more than any node offers is still refused there
    allowed, messages = _judged(_pod("h100-new", "16"))
    assert not allowed and any("more than any node offers (largest: 8 on a100-1)" in m for _, m in messages), messages


@pytest.mark.parametrize("gpus", [None, "0"], ids=["no GPUs yet", "no MIG slices"])
def test_the_messages_keep_their_node_with_long_names(gpus: str | None) -> None:
    # a warning past 256 characters loses its middle (review.limit_warnings): the node is at the end
    node = "ip-10-0-123-45.us-west-2.compute.internal"
    labelled = {**_node(node, gpus, []), "metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true" if gpus is None else ""}}}
    pod = _pod(node, resource="nvidia.com/mig-3g.40gb", namespace="research-team", name="llama-70b-finetune-worker-0")
    _, [(_, message)] = _judged(pod, [*NODES, labelled])
    shown = review.limit_warnings((f"[gpu-validations/resourceShape] {message}",))[0]
    assert shown.endswith(node) and shown.startswith("[gpu-validations/resourceShape] Pod research-team/llama-70b"), shown


@pytest.mark.parametrize(("node", "gpus"), [("cpu-1", "1"), ("no-such-node", "16")])
def test_a_static_pods_mirror_is_left_alone(node: str, gpus: str) -> None:
    # the kubelet runs a static pod whatever the API answers: refusing its mirror would only hide it
    mirror = _pod(node, gpus, annotations={"kubernetes.io/config.mirror": "abc"})
    assert _judged(mirror) == (True, [])
    # a template saying it makes mirrors is judged as any (only the kubelet makes mirror pods)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ml"},
                  "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                      "metadata": {"labels": {"app": "d"}, "annotations": {"kubernetes.io/config.mirror": "abc"}},
                      "spec": mirror["spec"]}}}
    assert not _judged(deployment)[0]

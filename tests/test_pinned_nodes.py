"""GPU pods pinned to a node by ``spec.nodeName``: they skip the scheduler, and the node's kubelet fails
a pod whose resources it cannot give (``OutOf<resource>``), at once; a template's controller then makes
another, and another. resourceShape (nodeCapacity) refuses what the named node cannot give; the control,
the same pod pinned to a node with its GPUs, is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import shipped_policies
from tests.test_daemon_sets import GPU_TAINT, _node
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

#: a GPU node with 8, one with 4, a CPU node, and a GPU node whose device plugin has not registered yet
NODES = [_node("a100-1", "8", [GPU_TAINT]), _node("t4-1", "4", [GPU_TAINT]), _node("cpu-1", None, []),
         {**_node("h100-new", None, []), "metadata": {"name": "h100-new", "labels": {"nvidia.com/gpu.present": "true"}}}]


def _pod(node: str, gpus: str = "1", **meta: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/train:1", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", **meta},
            "spec": {"nodeName": node, "containers": [container]}}


def _judged(obj: dict[str, Any]) -> tuple[bool, list[tuple[str, str]]]:
    judged = engine.evaluate(shipped_policies(), Request.for_object(obj), SnapshotView.from_objects(NODES), "validate")
    return judged.allowed, [(f.mode, f.message) for f in judged.findings if f.rule == "resourceShape"]


def test_a_gpu_pod_pinned_to_a_node_without_gpus_is_refused_with_what_to_do() -> None:
    allowed, [(mode, message)] = _judged(_pod("cpu-1"))
    assert not allowed and mode == "enforce"
    assert message == ("Pod ml/p: asks for 1 nvidia.com/gpu, but spec.nodeName binds it to cpu-1, which offers 0 (its kubelet "
                       "fails the pod: OutOfnvidia.com/gpu); remove nodeName, or name a node with nvidia.com/gpu")
    # control: pinned to a node with the GPUs, nothing to say
    assert _judged(_pod("a100-1")) == (True, [])


def test_more_gpus_than_the_pinned_node_offers_are_refused_though_another_node_has_them() -> None:
    allowed, [(_, message)] = _judged(_pod("t4-1", "8"))
    assert not allowed and "binds it to t4-1, which offers 4" in message
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
    assert not allowed and message.startswith("Deployment ml/d spec.template: asks for 1 nvidia.com/gpu, but spec.nodeName")


@pytest.mark.parametrize("node", ["no-such-node", ""])
def test_a_node_the_view_does_not_know_is_left_to_its_kubelet(node: str) -> None:
    assert _judged(_pod(node)) == (True, [])


def test_a_gpu_node_whose_device_plugin_has_not_registered_is_only_warned_of() -> None:
    allowed, [(mode, message)] = _judged(_pod("h100-new"))
    assert allowed and mode == "warn" and "h100-new, which has GPUs but offers no nvidia.com/gpu yet" in message
    assert len(f"[gpu-validations/resourceShape] {message}") <= 256  # (kube-apiserver keeps 256 characters)


def test_a_static_pods_mirror_is_left_alone() -> None:
    # the kubelet runs a static pod whatever the API answers: refusing its mirror would only hide it
    assert _judged(_pod("cpu-1", annotations={"kubernetes.io/config.mirror": "abc"})) == (True, [])

"""CUDA images against the drivers of the nodes a pod could land on: Ready nodes, and nodes not Ready yet.

Nodes are registered as a kubelet with GPU Feature Discovery would, on a
consumer GPU (where CUDA forward compatibility never applies), each test in
a pool of its own that its pods select.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from tests.e2e.admission import Admission
from tests.e2e.fixtures import TOLERATE_GPU, gpu_container, gpu_node, pod, register_node
from tests.e2e.kube import Kube, Object, Refused
from webhook.view import scheduling

CUDA_124 = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"  # needs driver >= 550.54.15 (FACTS.md §1)
DRIVER_FIELD = "nvidia.com/cuda.driver-version.full"
CONSUMER_GPU = "NVIDIA-GeForce-RTX-4090"


def _pool(admin: Kube, admission: Admission, drivers: list[str], *, ready: bool) -> str:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    for i, driver in enumerate(drivers):
        node = gpu_node(f"{pool}-{i}", driver, product=CONSUMER_GPU, extra_labels={"e2e-pool": pool})
        register_node(admin, admission, node, ready=ready)
    return pool


def _cuda_pod(name: str, namespace: str, pool: str) -> Object:
    return pod(name, namespace, gpu_container(image=CUDA_124), nodeSelector={"e2e-pool": pool},
               tolerations=[TOLERATE_GPU])


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "not-ready"])
def test_an_image_newer_than_every_driver_is_refused(
    admin: Kube, admission: Admission, namespace: str, ready: bool
) -> None:
    pool = _pool(admin, admission, ["535.104.05"], ready=ready)
    node = admin.get("v1", "Node", f"{pool}-0")
    taints = {t["key"] for t in node["spec"].get("taints") or []}
    assert ("node.kubernetes.io/not-ready" in taints) is not ready  # as a real cluster has it
    with pytest.raises(Refused) as refused:
        admin.create(_cuda_pod("new-cuda", namespace, pool))
    message = refused.value.message
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in message
    assert "CUDA 12.4.1" in message and "535.104.05" in message, message


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "not-ready"])
def test_an_image_the_drivers_support_is_stored(admin: Kube, admission: Admission, namespace: str, ready: bool) -> None:
    pool = _pool(admin, admission, ["550.54.15"], ready=ready)
    stored = admin.create(_cuda_pod("ok-cuda", namespace, pool))
    assert stored["spec"]["containers"][0]["image"] == CUDA_124


def test_a_pool_of_mixed_drivers_steers_the_pod_onto_the_capable_ones(
    admin: Kube, admission: Admission, namespace: str
) -> None:
    pool = _pool(admin, admission, ["535.104.05", "550.54.15", "550.90.07"], ready=True)
    stored = admin.create(_cuda_pod("steered", namespace, pool))
    required = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for term in required["nodeSelectorTerms"] for e in term["matchExpressions"]
                   if e["key"] == DRIVER_FIELD]
    # the pool's selector stays in each term: the capable drivers, or a newer branch or 550 release
    assert len(required["nodeSelectorTerms"]) == 3 and len(expressions) == 1
    assert expressions[0]["operator"] == "In" and sorted(expressions[0]["values"]) == ["550.54.15", "550.90.07"]
    # after a rolling driver upgrade the stored pod still matches the upgraded nodes, and not the old one
    upgraded = [gpu_node(f"{pool}-{i}", driver, extra_labels={"e2e-pool": pool})
                for i, driver in enumerate(["535.104.05", "575.57.08", "550.163.01"])]
    eligible = scheduling.NodeFilter(stored["spec"], {"nvidia.com/gpu": Decimal(1)}).select(upgraded)
    assert sorted(scheduling.node_name(n) for n in eligible) == [f"{pool}-1", f"{pool}-2"]


def test_setting_an_image_the_node_cannot_run_on_a_pod_is_refused(admin: Kube, admission: Admission, namespace: str) -> None:
    """`kubectl set image` on a pod: images are the part of a pod's spec an UPDATE may change."""
    pool = _pool(admin, admission, ["535.104.05"], ready=True)
    old = pod("set-image", namespace, gpu_container(image="nvidia/cuda:12.2.0-runtime-ubuntu22.04"),
              nodeSelector={"e2e-pool": pool}, tolerations=[TOLERATE_GPU])
    stored = admin.create(old)
    name = stored["spec"]["containers"][0]["name"]
    relabelled = admin.patch(stored, {"metadata": {"labels": {"touched": "yes"}}})
    assert relabelled["metadata"]["labels"]["touched"] == "yes", "an UPDATE changing no image is not judged"
    with pytest.raises(Refused) as refused:
        admin.patch(stored, {"spec": {"containers": [{"name": name, "image": CUDA_124}]}},
                    content_type="application/strategic-merge-patch+json")
    message = refused.value.message
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in message
    assert "CUDA 12.4.1" in message and "535.104.05" in message, message

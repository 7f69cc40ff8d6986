"""GPU pods pinned to a node by ``spec.nodeName``, through kube-apiserver and the webhooks.

Such a pod skips the scheduler: stored, it is bound, and the named node's kubelet fails it at once
when the node cannot give its GPUs (``OutOf<resource>``); a Deployment's controller then makes
another, and another. The validating webhook refuses it before it is stored (resourceShape,
nodeCapacity); the control, pinned to a node with the GPUs, is stored bound to that node.
"""

from __future__ import annotations

from tests.e2e.fixtures import cpu_node, deployment, gpu_container, gpu_node, pod
from tests.e2e.kube import Kube, Refused
from tests.e2e.placement.pool import Pool

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'


def test_a_gpu_pod_pinned_to_a_node_without_gpus_is_refused_and_one_pinned_to_a_gpu_node_is_stored_there(
    admin: Kube, pool: Pool, namespace: str
) -> None:
    pool.register(gpu_node("gpu-a", "535.104.05"), cpu_node("cpu"))
    cpu, gpu = pool.node_name("cpu"), pool.node_name("gpu-a")
    pinned_deployment = deployment("pinned", namespace, gpu_container())
    pinned_deployment["spec"]["template"]["spec"]["nodeName"] = cpu
    made = pool.create([
        pod("on-cpu", namespace, gpu_container(), nodeName=cpu),
        pod("on-gpu", namespace, gpu_container(), nodeName=gpu),
        pinned_deployment,
    ])
    for name in ("on-cpu", "pinned"):
        refused = made[name]
        assert isinstance(refused, Refused) and DENIED in refused.message, refused
        assert "its kubelet fails it (OutOfnvidia.com/gpu): its node offers 0 of the 1 nvidia.com/gpu it asks for; remove " \
            f"spec.nodeName, or name a node with them instead of {cpu}" in refused.message, refused.message
    stored = made["on-gpu"]
    assert not isinstance(stored, Refused), stored
    assert admin.get("v1", "Pod", "on-gpu", namespace)["spec"]["nodeName"] == gpu
    # what is stored: the control alone
    assert [p["metadata"]["name"] for p in admin.list("v1", "Pod", namespace)] == ["on-gpu"]
    assert not admin.list("apps/v1", "Deployment", namespace)

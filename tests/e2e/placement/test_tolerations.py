"""The GPU toleration the webhook adds, seen in where the scheduler puts pods.

GPU nodes carry ``nvidia.com/gpu:NoSchedule`` (as the GPU Operator and
managed node pools set it): only pods tolerating it land there.
"""

from __future__ import annotations

from tests.e2e.fixtures import TOLERATE_GPU, cpu_node, gpu_container, gpu_node, pod
from tests.e2e.kube import Kube
from tests.e2e.placement.pool import Pool, landed_on, placements


def cpu_container(cpu: str = "4") -> dict[str, object]:
    return {"name": "web", "image": "nginx", "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}


def test_an_opted_in_gpu_pod_reaches_the_tainted_gpu_node_and_a_cpu_pod_stays_off_it(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    # the GPU node is the smaller one: whatever lands there makes it the more allocated under packing
    pool.register(gpu_node("gpu", "535.104.05", gpus=8, cpu="16", memory="128Gi"), cpu_node("cpu"))
    trainer = gpu_container(image="nvidia/cuda:12.2.0-base-ubuntu22.04")
    trainer["resources"]["limits"]["cpu"] = "8"
    pool.create([pod("trainer", namespace, trainer), pod("trainer", plain_namespace, trainer)])
    assert landed_on(placements(admin, namespace, ["trainer"]), pool) == {"trainer": "gpu"}
    # control: the same pod where the webhook does not act has no toleration, and nowhere to go
    assert landed_on(placements(admin, plain_namespace, ["trainer"]), pool) == {"trainer": None}
    stored = admin.get("v1", "Pod", "trainer", plain_namespace)
    assert "tolerations" not in stored["spec"] or TOLERATE_GPU not in stored["spec"]["tolerations"]

    # a CPU pod in the opted-in namespace is left alone: it lands on the CPU node although packing
    # prefers the GPU node (half its CPUs taken by the trainer)
    pool.create([pod("web", namespace, cpu_container()),
                 # control: the same pod tolerating the GPU taint by hand goes to the fuller GPU node
                 pod("web", plain_namespace, cpu_container(), tolerations=[TOLERATE_GPU])])
    assert landed_on(placements(admin, namespace, ["web"]), pool) == {"web": "cpu"}
    assert landed_on(placements(admin, plain_namespace, ["web"]), pool) == {"web": "gpu"}
    assert "tolerations" not in admin.get("v1", "Pod", "web", namespace)["spec"] or all(
        t.get("key") != "nvidia.com/gpu" for t in admin.get("v1", "Pod", "web", namespace)["spec"]["tolerations"])

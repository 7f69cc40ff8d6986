"""GPUs through Dynamic Resource Allocation, end to end: the resourceclaim controller makes the
pod's claim from its template, the scheduler allocates a device some node publishes and binds
the pod there, and the pod carries the webhook's mutations.

The GPU node is tainted ``nvidia.com/gpu:NoSchedule`` and publishes its GPUs in a ResourceSlice
as NVIDIA's gpu-kubelet-plugin does (no GFD labels, no nvidia.com/gpu); the pool also holds a CPU
node. The control: the same pod where the webhook does not act has no toleration, and stays
unschedulable.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.admission import Admission
from tests.e2e.fixtures import PLACEMENT_CAP, charged, cpu_node, wait_for_view
from tests.e2e.kube import Kube, Object, Refused, eventually
from tests.e2e.placement.pool import Pool, landed_on, placements
from tests.e2e.placement.test_workloads import stays
from tests.e2e.test_dra import GPU_TOLERATION, V1, dra_pod, template

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def device_class() -> Object:
    """NVIDIA's gpu.nvidia.com class, as its chart installs it (as tests/e2e/test_dra.py has it)."""
    return {"apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression":
                     "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}


def gpu_slice(node: str, gpus: int) -> Object:
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "driverVersion": {"version": "550.54.15"}}} for i in range(gpus)]
    return {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def test_a_dra_pod_gets_its_claim_allocated_and_lands_on_the_node_publishing_the_device(
    admin: Kube, admission: Admission, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    admin.ensure(device_class())
    gpu = cpu_node("gpu", cpu="64", memory="256Gi")
    gpu["spec"] = {"taints": [GPU_TAINT]}
    pool.register(gpu, cpu_node("cpu"))
    node = pool.node_name("gpu")
    published = admin.create(gpu_slice(node, gpus=2))
    try:
        wait_for_view(admin, admission, "resourceslices", V1, "ResourceSlice")
        for ns in (namespace, plain_namespace):
            admin.create(template("one-gpu", ns))
        wait_for_view(admin, admission, "resourceclaimtemplates", V1, "ResourceClaimTemplate")
        pool.create([dra_pod("trainer", namespace, "one-gpu"), dra_pod("trainer", plain_namespace, "one-gpu")])

        assert landed_on(placements(admin, namespace, ["trainer"]), pool) == {"trainer": "gpu"}
        stored = admin.get("v1", "Pod", "trainer", namespace)
        # the webhook's mutations are on the pod the scheduler placed
        spec = stored["spec"]
        assert spec["tolerations"].count(GPU_TOLERATION) == 1, spec["tolerations"]
        train, logs = spec["containers"]
        assert [m["mountPath"] for m in train["volumeMounts"]] == ["/dev/shm"]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in logs["env"]
        # the claim the resourceclaim controller made, allocated a device of that node, reserved for the pod
        (status,) = eventually(lambda: (admin.get("v1", "Pod", "trainer", namespace).get("status") or {}).get(
            "resourceClaimStatuses"), what="the pod's generated claim")
        claim = admin.get(V1, "ResourceClaim", status["resourceClaimName"], namespace)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"][:4]) == ("gpu.nvidia.com", node, "gpu-"), result
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["trainer"]

        # the control: no toleration without the webhook, so the GPU node is out of reach
        assert landed_on(placements(admin, plain_namespace, ["trainer"]), pool) == {"trainer": None}
    finally:
        admin.delete(published)


def test_pods_whose_template_is_deleted_keep_their_claims_gpus_under_the_cap(
    admin: Kube, admission: Admission, pool: Pool, capped_namespaces: Callable[[int], list[str]]
) -> None:
    """Issue #41, third row: 8 pods from a ResourceClaimTemplate (claims made by the resourceclaim controller,
    allocated by the scheduler) under a team cap of 8; the template deleted (a Helm or GitOps rename), a
    recount: the pods still hold their claims' GPUs, and 8 more pods from a new template are refused. The
    control: the first 8 fill the cap exactly."""
    admin.ensure(device_class())
    gpu = cpu_node("gpu", cpu="64", memory="256Gi")
    gpu["spec"] = {"taints": [GPU_TAINT]}
    pool.register(gpu)
    published = admin.create(gpu_slice(pool.node_name("gpu"), gpus=2 * PLACEMENT_CAP))
    (namespace,) = capped_namespaces(1)
    try:
        wait_for_view(admin, admission, "resourceslices", V1, "ResourceSlice")
        made = admin.create(template("one-gpu", namespace))
        wait_for_view(admin, admission, "resourceclaimtemplates", V1, "ResourceClaimTemplate")
        first = pool.create([dra_pod(f"first-{i}", namespace, "one-gpu") for i in range(PLACEMENT_CAP)])
        assert not [n for n, r in first.items() if isinstance(r, Refused)], first
        assert set(landed_on(placements(admin, namespace, count=PLACEMENT_CAP), pool).values()) == {"gpu"}
        eventually(lambda: all((p.get("status") or {}).get("resourceClaimStatuses")
                               for p in admin.list("v1", "Pod", namespace)), what="the pods' generated claims")

        admin.delete(made)  # the template goes; the pods keep the claims made from it
        wait_for_view(admin, admission, "resourceclaimtemplates", V1, "ResourceClaimTemplate")
        ns = admin.get("v1", "Namespace", namespace)
        admin.patch(ns, {"metadata": {"labels": {"e2e-touched": "yes"}}})  # a namespace's labels change: a recount
        stays(lambda: len(charged(admin, namespace)) == PLACEMENT_CAP, 8,
              f"the {PLACEMENT_CAP} pods charged through the recount")

        admin.create(template("renamed", namespace))
        wait_for_view(admin, admission, "resourceclaimtemplates", V1, "ResourceClaimTemplate")
        more = pool.create([dra_pod(f"more-{i}", namespace, "renamed") for i in range(PLACEMENT_CAP)])
        refused = [r for r in more.values() if isinstance(r, Refused)]
        assert len(refused) == PLACEMENT_CAP, more
        assert all(f"uses {PLACEMENT_CAP} of {PLACEMENT_CAP} nvidia.com/gpu" in r.message for r in refused), refused
    finally:
        admin.delete(published)

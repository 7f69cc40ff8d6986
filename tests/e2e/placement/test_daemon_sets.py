"""A GPU DaemonSet through the real DaemonSet controller and scheduler.

Its controller puts a pod on every node the template selects and tolerates, bound to that node,
whatever the pod asks for: the GPU toleration the webhook adds to the pods comes too late to take
them to the tainted GPU nodes. The webhook warns of it when the DaemonSet is made (resourceShape,
nodeCapacity), and the template the warnings ask for puts a pod on each GPU node.
"""

from __future__ import annotations

from tests.e2e.fixtures import TOLERATE_GPU, cpu_node, daemon_set, gpu_container, gpu_node
from tests.e2e.kube import Kube, Object, eventually
from tests.e2e.placement.pool import Pool, landed_on, placements


def _create(admin: Kube, obj: Object) -> list[str]:
    """Create ``obj``; the warnings kube-apiserver answered with (its Warning headers)."""
    resource = admin.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    response = resource.create(body=obj, namespace=obj["metadata"]["namespace"], serialize=False)  # (urllib3's)
    return [str(w) for w in response.headers.getlist("Warning")]


def _pods_of(admin: Kube, namespace: str, name: str, count: int) -> list[str]:
    def made() -> list[str] | None:
        pods = [p["metadata"]["name"] for p in admin.list("v1", "Pod", namespace)
                if any(o.get("name") == name for o in p["metadata"].get("ownerReferences") or [])]
        return pods if len(pods) >= count else None

    return eventually(made, timeout=60, what=f"{count} pod(s) of the DaemonSet {name}")


def test_a_gpu_daemon_set_goes_where_its_template_tolerates_and_the_webhook_says_so(
    admin: Kube, pool: Pool, namespace: str
) -> None:
    pool.register(gpu_node("gpu-a", "535.104.05"), gpu_node("gpu-b", "535.104.05"), cpu_node("cpu"))
    probe = gpu_container(name="probe", image="nvidia/cuda:12.2.0-base-ubuntu22.04")

    # a GPU DaemonSet as a data scientist writes it: no toleration, no node selection
    warnings = _create(admin, pool.workload(daemon_set("probe", namespace, probe)))
    assert any("its pods reach 1 of 1 node(s) without 1 nvidia.com/gpu" in w and "and none of the 2 with it: tolerate "
               "nvidia.com/gpu:NoSchedule, select nvidia.com/gpu.present=true" in w for w in warnings), warnings
    # the outcome they describe: one pod, bound to the CPU node, Pending there; none on a GPU node
    [bare] = _pods_of(admin, namespace, "probe", 1)
    assert list(landed_on(placements(admin, namespace, [bare]), pool).values()) == [None]
    affinity = admin.get("v1", "Pod", bare, namespace)["spec"]["affinity"]["nodeAffinity"]
    assert pool.node_name("cpu") in str(affinity), affinity
    # (the webhook gave that pod the GPU toleration, as every GPU pod: it does not move it)
    assert TOLERATE_GPU in admin.get("v1", "Pod", bare, namespace)["spec"]["tolerations"]

    # the template as the warnings ask: it tolerates and selects the GPU nodes; a pod on each, running there
    warnings = _create(admin, pool.workload(daemon_set(
        "probe-fixed", namespace, probe, tolerations=[TOLERATE_GPU], nodeSelector={"nvidia.com/gpu.present": "true"})))
    assert not [w for w in warnings if "its pods reach" in w], warnings
    fixed = _pods_of(admin, namespace, "probe-fixed", 2)
    assert sorted(str(n) for n in landed_on(placements(admin, namespace, fixed), pool).values()) == ["gpu-a", "gpu-b"]

"""Priority classes by workload class (gpu-defaults' priorityClass rule), seen in preemption.

deploy/base/priorityclasses.yaml: gpu-training (50000, PreemptLowerPriority) may preempt
gpu-batch (10000, preemptionPolicy Never), and gpu-batch never preempts anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import deployment, gpu_container, gpu_node, pod
from tests.e2e.kube import Kube, Object, eventually
from tests.e2e.placement.pool import Pool, delete_now, bound, landed_on, placements
from tests.e2e.placement.test_workloads import stays

CLASS_LABEL = "gpu-admission.io/workload-class"


def classed(name: str, namespace: str, workload_class: str) -> Object:
    return pod(name, namespace, gpu_container(), labels={CLASS_LABEL: workload_class})


def test_a_training_pod_preempts_batch_pods_and_a_batch_pod_does_not(admin: Kube, pool: Pool, namespace: str) -> None:
    (node,) = pool.register(gpu_node("a100", "535.104.05", gpus=2))
    pool.create([classed(f"batch-{i}", namespace, "batch") for i in range(2)])
    assert landed_on(placements(admin, namespace, ["batch-0", "batch-1"]), pool) == {"batch-0": "a100", "batch-1": "a100"}
    victims = [admin.get("v1", "Pod", f"batch-{i}", namespace) for i in range(2)]
    assert {(p["spec"]["priorityClassName"], p["spec"]["priority"], p["spec"]["preemptionPolicy"]) for p in victims} == {
        ("gpu-batch", 10000, "Never")}

    # the control: one more batch pod finds the node full, and waits without preempting
    pool.create([classed("batch-late", namespace, "batch")])
    assert landed_on(placements(admin, namespace, ["batch-late"]), pool) == {"batch-late": None}
    late = admin.get("v1", "Pod", "batch-late", namespace)
    assert not (late.get("status") or {}).get("nominatedNodeName"), late["status"]
    assert not any(admin.get("v1", "Pod", f"batch-{i}", namespace)["metadata"].get("deletionTimestamp") for i in range(2))

    pool.create([classed("trainer", namespace, "training")])
    trainer = eventually(lambda: _nominated(admin, namespace, "trainer"), timeout=30,
                         what="the training pod nominated to a node")
    assert trainer["spec"]["priorityClassName"] == "gpu-training" and trainer["spec"]["priority"] == 50000
    assert trainer["status"]["nominatedNodeName"] == node["metadata"]["name"]
    evicted = eventually(lambda: _preempted(admin, namespace), timeout=30, what="a batch pod preempted")
    assert len(evicted) == 1, evicted
    # no kubelet confirms the victim stopped: once it is gone, the training pod takes its GPU
    for name in evicted:
        delete_now(admin, {"metadata": {"name": name, "namespace": namespace}})
    assert bound(admin, namespace, "trainer") == node["metadata"]["name"]
    assert "nodeName" not in admin.get("v1", "Pod", "batch-late", namespace)["spec"]


@pytest.fixture
def tenant_namespace(admin: Kube) -> Iterator[str]:
    """An opted-in namespace the platform allows no workload class above batch (no
    workload-classes.gpu-admission.io/* label)."""
    name = f"e2e-tenant-{uuid.uuid4().hex[:8]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {OPT_IN: "true"}}})
    yield name
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def test_a_deployment_preempts_only_where_its_namespace_may_choose_inference(
    admin: Kube, pool: Pool, namespace: str, tenant_namespace: str
) -> None:
    """Issue #42 row 7: a tenant picks a Deployment (the inference class) as freely as a label. In a
    namespace not allowed inference its pod gets gpu-batch and waits; the control, the same Deployment
    where the platform allows inference, gets gpu-inference and preempts a batch pod."""
    (node,) = pool.register(gpu_node("a100", "535.104.05", gpus=2))
    pool.create([classed(f"batch-{i}", namespace, "batch") for i in range(2)])
    assert landed_on(placements(admin, namespace, ["batch-0", "batch-1"]), pool) == {"batch-0": "a100", "batch-1": "a100"}

    admin.create(pool.workload(deployment("serve", tenant_namespace, gpu_container(name="serve"))))
    [waiting] = eventually(lambda: admin.list("v1", "Pod", tenant_namespace) or None, timeout=30,
                           what="the tenant Deployment's pod")
    assert (waiting["spec"]["priorityClassName"], waiting["spec"]["priority"]) == ("gpu-batch", 10000)
    assert landed_on(placements(admin, tenant_namespace, count=1), pool) == {waiting["metadata"]["name"]: None}
    stays(lambda: not _preempted(admin, namespace) and not (admin.list("v1", "Pod", tenant_namespace)[0].get(
        "status") or {}).get("nominatedNodeName"), 5, "the tenant's pod waits without preempting")

    admin.create(pool.workload(deployment("serve", namespace, gpu_container(name="serve"))))
    server = eventually(lambda: next((p for p in admin.list("v1", "Pod", namespace)
                                      if p["metadata"]["name"].startswith("serve-")
                                      and (p.get("status") or {}).get("nominatedNodeName")), None),
                        timeout=30, what="the allowed Deployment's pod nominated to a node")
    assert (server["spec"]["priorityClassName"], server["spec"]["priority"]) == ("gpu-inference", 100000)
    evicted = eventually(lambda: _preempted(admin, namespace), timeout=30, what="a batch pod preempted")
    assert len(evicted) == 1, evicted


def _nominated(admin: Kube, namespace: str, name: str) -> Object | None:
    found = admin.get("v1", "Pod", name, namespace)
    return found if (found.get("status") or {}).get("nominatedNodeName") else None


def _preempted(admin: Kube, namespace: str) -> list[str]:
    """The batch pods the scheduler deleted (gone, or terminating as no kubelet confirms them)."""
    names = {p["metadata"]["name"]: p for p in admin.list("v1", "Pod", namespace)}
    return [f"batch-{i}" for i in range(2)
            if f"batch-{i}" not in names or names[f"batch-{i}"]["metadata"].get("deletionTimestamp")]

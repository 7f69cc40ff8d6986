"""The affinities of the shipped policies, seen in where the scheduler puts pods.

- gpu-defaults: a pod asking for MIG devices requires ``nvidia.com/mig.capable=true``;
- inference-spread: replicas of an inference workload repel each other across nodes
  (preferred anti-affinity on ``kubernetes.io/hostname``);
- training-locality: the pods of one training job attract each other within a zone
  (preferred affinity on ``topology.kubernetes.io/zone``).

Each case has its control: the same pods in a namespace that is not opted in,
tolerating the GPU taint by hand, land elsewhere.
"""

from __future__ import annotations

from collections import Counter

from tests.e2e.control_plane import SPREADING
from tests.e2e.fixtures import TOLERATE_GPU, deployment, gpu_container, gpu_node, pod
from tests.e2e.kube import Kube, Object
from tests.e2e.placement.pool import Pool, landed_on, placements, with_cpu

ZONE = "topology.kubernetes.io/zone"
MIG = "nvidia.com/mig-1g.10gb"


def mig_container() -> Object:
    return {"name": "infer", "image": "nvidia/cuda:12.2.0-base-ubuntu22.04",
            "resources": {"limits": {MIG: 1, "memory": "8Gi", "cpu": "4"}}}


def test_a_mig_pod_is_kept_to_mig_capable_nodes(admin: Kube, pool: Pool, namespace: str, plain_namespace: str) -> None:
    """Both nodes advertise MIG devices, but GFD says one is not MIG-capable (its MIG mode switched off, the
    device plugin not yet caught up): the smaller one, where packing would put the pod."""
    pool.register(
        gpu_node("mig", "535.104.05", extra_labels={"nvidia.com/mig.capable": "true"}, extra_capacity={MIG: "7"}),
        gpu_node("stale", "535.104.05", cpu="8", extra_labels={"nvidia.com/mig.capable": "false"},
                 extra_capacity={MIG: "7"}),
    )
    pool.create([pod("infer", namespace, mig_container()),
                 pod("infer", plain_namespace, mig_container(), tolerations=[TOLERATE_GPU])])
    assert landed_on(placements(admin, namespace, ["infer"]), pool) == {"infer": "mig"}
    # the control: nothing keeps it off the fuller node
    assert landed_on(placements(admin, plain_namespace, ["infer"]), pool) == {"infer": "stale"}
    required = admin.get("v1", "Pod", "infer", namespace)["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert all({"key": "nvidia.com/mig.capable", "operator": "In", "values": ["true"]} in term["matchExpressions"]
               for term in required["nodeSelectorTerms"]), required


def test_inference_replicas_spread_across_nodes_under_packing(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    """A Deployment through the real controllers (its pods are inference: owned by a ReplicaSet), under the
    packing profile, which has no default spreading of its own."""
    pool.register(*(gpu_node(f"n{i}", "535.104.05", extra_labels={ZONE: f"zone-{i % 2}"}) for i in range(3)))
    for ns in (namespace, plain_namespace):
        serving = pool.workload(deployment("llm", ns, gpu_container(name="llm")))
        serving["spec"]["replicas"] = 3
        if ns == plain_namespace:
            serving["spec"]["template"]["spec"]["tolerations"] = [TOLERATE_GPU]
        admin.create(serving)
    spread = landed_on(placements(admin, namespace, count=3), pool)
    packed = landed_on(placements(admin, plain_namespace, count=3), pool)
    assert len(spread) == 3 and sorted(spread.values()) == ["n0", "n1", "n2"], spread  # type: ignore[type-var]
    # the control: packing puts every replica on one node
    assert len(packed) == 3 and len(set(packed.values())) == 1, packed


def test_training_workers_stay_in_one_zone_under_spreading(
    admin: Kube, pool: Pool, namespace: str, plain_namespace: str
) -> None:
    """The workers of a PyTorchJob (the labels its operator sets) under the spreading profile, which puts
    pods on the least allocated nodes: two zones of two nodes."""
    pool.register(*(gpu_node(f"{zone}-{i}", "535.104.05", extra_labels={ZONE: zone})
                    for zone in ("a", "b") for i in range(2)))

    def workers(ns: str, tolerations: list[Object]) -> list[Object]:
        labels = {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "worker"}
        return [pod(f"bert-worker-{i}", ns, gpu_container(), labels=labels, tolerations=tolerations)
                for i in range(4)]

    # the control first (one worker a node, both zones), so that the pool is even again for the others
    pool.create(workers(plain_namespace, [TOLERATE_GPU]), scheduler=SPREADING)
    spread = landed_on(placements(admin, plain_namespace, count=4), pool)
    assert sorted(Counter(str(n)[0] for n in spread.values()).values()) == [2, 2], spread
    pool.create(workers(namespace, []), scheduler=SPREADING)
    local = landed_on(placements(admin, namespace, count=4), pool)
    assert None not in local.values() and len({str(n)[0] for n in local.values()}) == 1, local

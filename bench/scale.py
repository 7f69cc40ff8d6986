"""Benchmark: admission cost against a fleet versus against a 10-node cluster.

Validation (resource shape, GPU quotas of every scope with caps on, native
ResourceQuotas, CUDA against node drivers) plus mutation (CUDA steering) of
the 4-GPU training pod, and of a pod whose GPU comes from a DRA claim,
against:

- a fleet of 5,000 nodes and 100,000 pods (30,000 of them GPU pods) in 200
  namespaces of 20 teams, 4 GPU models, 5 driver versions, 3 zones; one node
  in ten hands its GPUs out through DRA (a ResourceSlice of 8 GPUs, no GPU
  Feature Discovery labels);
- a cluster of 10 nodes of the same pools and the same namespaces, 30 pods.

Both are ``SnapshotView``s (the audit CLI's view), which answer through the
same aggregates as the server's index. The cases run interleaved in one
process; it prints medians and the ratio (target: fleet <= 1.5x small).

    make bench-scale             # or: python bench/scale.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import FALLBACK, REVIEW, _median_seconds, with_quota_caps  # noqa: E402
from webhook.policy import engine, loader  # noqa: E402
from webhook.policy.request import Request  # noqa: E402
from webhook.review import parse_review  # noqa: E402
from webhook.view.snapshot import SnapshotView  # noqa: E402

#: (GPU model, driver) pools; the GeForce pool cannot run the training image's CUDA (no forward
#: compatibility on consumer GPUs), so steering has work
POOLS = [
    ("NVIDIA-A100-SXM4-80GB", "535.104.05"), ("NVIDIA-A100-SXM4-80GB", "470.223.02"),
    ("NVIDIA-H100-80GB-HBM3", "550.54.15"), ("NVIDIA-H100-80GB-HBM3", "570.86.10"),
    ("NVIDIA-L40S", "550.54.15"), ("Tesla-T4", "470.223.02"), ("Tesla-T4", "535.104.05"),
    ("NVIDIA-GeForce-RTX-4090", "470.223.02"),
]
ZONES = ["zone-a", "zone-b", "zone-c"]
NAMESPACES, TEAMS = 200, 20
REQUEST_NAMESPACE = "ml-0"


def _node(n: int) -> dict[str, Any]:
    product, driver = POOLS[n % len(POOLS)]
    major, minor, rev = driver.split(".")
    name = f"gpu-{n:05}"
    labels = {
        "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": ZONES[n % len(ZONES)],
        "nvidia.com/gfd.timestamp": str(1700000000 + n), "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": "8", "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": major, "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev, "node.kubernetes.io/instance-type": "p5.48xlarge",
    }
    taints = [{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}]
    if n % 97 == 0:  # a few NotReady nodes: condition taints do not split groups
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"})
    allocatable = {"cpu": "191500m", "memory": f"{2000000000 + n}Ki", "nvidia.com/gpu": "8"}
    if n % 10 == 0:  # a DRA node: its driver publishes the GPUs, GFD does not label it
        labels = {k: v for k, v in labels.items() if not k.startswith("nvidia.com/")}
        allocatable.pop("nvidia.com/gpu")
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints}, "status": {"allocatable": allocatable}}


def _slice(n: int) -> dict[str, Any]:
    """The GPUs of a DRA node as NVIDIA's gpu-kubelet-plugin publishes them (driverVersion a semver)."""
    product, driver = POOLS[n % len(POOLS)]
    semver = ".".join(str(int(part)) for part in driver.split("."))
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "productName": {"string": product.replace("-", " ")},
                                                    "driverVersion": {"version": semver}}} for i in range(8)]
    name = f"gpu-{n:05}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": name, "pool": {"name": name, "generation": 1,
                                                                             "resourceSliceCount": 1}, "devices": devices}}


def _pod(p: int, nodes: int) -> dict[str, Any]:
    namespace = f"ml-{p % NAMESPACES}"
    meta = {"name": f"p{p}", "namespace": namespace}
    if p % 10 >= 3:  # 3 pods in 10 hold GPUs
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": _CPU_SPEC, "status": _RUNNING}
    spec: dict[str, Any] = {"nodeName": f"gpu-{p % nodes:05}", "containers": [
        {"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if p % 7 == 0:
        spec["priorityClassName"] = "gpu-inference"
    if p % 11 == 0:  # pending, pinned to a model by its selector
        spec.pop("nodeName")
        spec["nodeSelector"] = {"nvidia.com/gpu.product": POOLS[p % len(POOLS)][0]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}
    phase = "Succeeded" if p % 13 == 0 else "Running"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


_CPU_SPEC = {"containers": [{"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}
_RUNNING = {"phase": "Running"}


def cluster(nodes: int, pods: int) -> SnapshotView:
    objects: list[dict[str, Any]] = [_node(n) for n in range(nodes)]
    objects.extend(_slice(n) for n in range(0, nodes, 10))
    objects.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-gpu", "namespace": REQUEST_NAMESPACE},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})
    for ns in range(NAMESPACES):
        name = f"ml-{ns}"
        objects.append({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": name, "labels": {"team": f"t{ns % TEAMS}", "kubernetes.io/metadata.name": name}}})
        objects.append({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": name},
                        "spec": {"hard": {"requests.nvidia.com/gpu": "512"}},
                        "status": {"hard": {"requests.nvidia.com/gpu": "512"}, "used": {"requests.nvidia.com/gpu": "100"}}})
    objects.extend(_pod(p, nodes) for p in range(pods))
    return SnapshotView.from_objects(objects, known=("deviceclasses", "resourceclaims"))


def dra_pod() -> Request:
    """A pod whose GPU comes from a claim template, image as the training pod's."""
    return Request.for_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra", "namespace": REQUEST_NAMESPACE},
                               "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                                        "containers": [{"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                                        "resources": {"claims": [{"name": "gpu"}]}}]}})


def policies_with_caps() -> loader.PolicySet:
    """The shipped policies with caps of every scope enforced: namespace, team, model, priority class."""
    return with_quota_caps([
        {"scope": "namespace", "namespaces": ["ml-*"], "max": 100000},
        {"scope": "team", "teamLabel": "team", "max": 100000},
        {"scope": "namespace", "model": "NVIDIA-H100-80GB-HBM3", "max": 100000},
        {"scope": "team", "teamLabel": "team", "model": "any", "max": 100000},
        {"scope": "team", "teamLabel": "team", "priorityClasses": ["gpu-inference"], "max": 100000},
    ])


def admit(policies: loader.PolicySet, request: Request, view: SnapshotView) -> None:
    """What kube-apiserver asks of both webhooks for one pod: mutate, then validate the result
    (the object as the mutation patched it, which is what kube-apiserver sends the validating webhook)."""
    mutated = engine.evaluate(policies, request, view, "mutate")
    if mutated.patch:
        request = replace(request, object=mutated.patched)
    validated = engine.evaluate(policies, request, view, "validate")
    assert mutated.allowed and validated.allowed, (mutated.message(), validated.message())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=5000, help="fleet size (smaller for a quick check)")
    parser.add_argument("--pods", type=int, default=100_000)
    args = parser.parse_args()
    text = (REVIEW if REVIEW.exists() else FALLBACK).read_text()
    request = replace(parse_review(text).request, namespace=REQUEST_NAMESPACE)
    policies = policies_with_caps()
    started = time.perf_counter()
    fleet, small = cluster(args.nodes, args.pods), cluster(10, 30)
    for view in (fleet, small):  # the first admission works the aggregates out (once per snapshot)
        admit(policies, request, view)
    print(f"built: {time.perf_counter() - started:.1f} s; fleet: {len(list(fleet.nodes()))} nodes, "
          f"{len(list(fleet.pods()))} pods, {len(fleet.node_groups())} node groups")
    steered = engine.evaluate(policies, request, fleet, "mutate")
    print(f"mutation against the fleet: {len(steered.patch)} patch operations, "
          f"steered: {any(what == 'nodeAffinity' for _, _, what in steered.changes)}")
    big = f"{args.nodes:,} nodes / {args.pods:,} pods"
    for pod, sent in (("training pod", request), ("DRA claim pod", dra_pod())):
        cases = {"10 nodes": small, big: fleet}
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, view in cases.items():
                samples[name].extend(_median_seconds(partial(admit, policies, sent, view), 1, args.batch))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        for name, median in medians.items():
            print(f"{pod}: mutate+validate, {name:28} median {median * 1e6:8.1f} us")
        ratio = medians[big] / medians["10 nodes"]
        print(f"target ({pod}): fleet <= 1.50x 10 nodes -> {'met' if ratio <= 1.5 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()

"""DRA claims: the corpus' DRA manifests through the shipped policies, and properties of how claims count.

Sources of the shapes: NVIDIA's DRA driver quickstart specs in the corpus
(corpus/manifests/NVIDIA__k8s-dra-driver__demo__specs__quickstart__*), the
AKS and Kueue DRA samples there, and the Kubernetes DRA API (resource.k8s.io/v1:
exactly, firstAvailable, allocationMode, count).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import MANIFESTS, apply_patch, assert_schema_valid, shipped_policies
from webhook.kube import dra
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

DRA_FILES = sorted(p for p in MANIFESTS.glob("*.yaml") if "dra" in p.name.lower()) if MANIFESTS.is_dir() else []
GPU_CLASSES = {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"}


def _objects(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _uses_gpu_class(obj: dict[str, Any], objects: list[dict[str, Any]]) -> bool:
    """Independently of the engine: does a pod spec in ``obj`` name a claim of a GPU class in ``objects``?"""
    claims = {(o["kind"], o["metadata"]["name"]): o for o in objects if dra.is_claim("resource.k8s.io", o.get("kind", ""))}
    spec = obj.get("spec", {})
    spec = spec.get("template", {}).get("spec", spec)
    for entry in spec.get("resourceClaims", []):
        key = ("ResourceClaimTemplate", entry.get("resourceClaimTemplateName")) if "resourceClaimTemplateName" in entry \
            else ("ResourceClaim", entry.get("resourceClaimName"))
        found = claims.get(key)
        text = yaml.safe_dump(found) if found else ""
        if any(f"deviceClassName: {c}\n" in text for c in GPU_CLASSES):
            return True
    return False


@pytest.mark.skipif(not DRA_FILES, reason=f"no DRA manifests in {MANIFESTS}")
@pytest.mark.parametrize("path", DRA_FILES, ids=lambda p: p.name)
def test_corpus_dra_manifests(path: Path) -> None:
    """Every pod spec of the file: mutated when its claims are GPU claims (else untouched), the patch
    applies and is schema-valid, a second pass changes nothing; every claim passes the shipped policy."""
    objects = _objects(path)
    view = SnapshotView.from_objects([]).with_objects(objects)
    policies = shipped_policies()
    for obj in objects:
        request = Request.for_object(obj)
        mutation = engine.evaluate(policies, request, view, "mutate")
        gpu_pod = _uses_gpu_class(obj, objects) and obj["kind"] == "Pod"  # gpu-defaults mutates Pods only
        assert bool(mutation.changes) is gpu_pod, (obj["kind"], mutation.changes)
        patched = apply_patch(obj, mutation.patch)
        assert_schema_valid(patched)
        assert engine.evaluate(policies, Request.for_object(patched), view, "mutate").patch == ()
        validation = engine.evaluate(policies, Request.for_object(patched), view, "validate")
        assert validation.allowed, validation.message()


POLICY = loader.load_text("""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: caps}
spec:
  match: {kinds: ["*"]}
  rules:
    tolerations: {mode: enforce}
    resourceShape: {mode: enforce, maxPerPod: {nvidia.com/gpu: 6}}
    draClaims: {mode: enforce, allocationModeAll: allow, maxPerClaim: {nvidia.com/gpu: 5}}
""")

CLASSES = st.sampled_from(["gpu.nvidia.com", "vfio.gpu.nvidia.com", "rdma.example.com"])
ASK = st.fixed_dictionaries({"deviceClassName": CLASSES, "count": st.integers(1, 4)})


@st.composite
def claim_requests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-3 requests, each ``exactly`` one ask or ``firstAvailable`` alternatives."""
    requests: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            requests.append({"name": f"r{index}", "exactly": draw(ASK)})
        else:
            subs = draw(st.lists(ASK, min_size=1, max_size=3))
            requests.append({"name": f"r{index}", "firstAvailable": [{"name": f"s{i}", **s} for i, s in enumerate(subs)]})
    return requests


def _model(requests: list[dict[str, Any]]) -> int:
    """GPUs a claim of these requests takes: per request, the GPU alternative with the most devices."""
    total = 0
    for request in requests:
        asks = [request["exactly"]] if "exactly" in request else request["firstAvailable"]
        counts = [a["count"] for a in asks if a["deviceClassName"] != "rdma.example.com"]
        total += max(counts, default=0)
    return total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=claim_requests(), shared=claim_requests(), users=st.lists(st.booleans(), min_size=1, max_size=3))
def test_a_pod_counts_each_claim_once_and_its_gpu_containers_are_its_claim_users(
    template: list[dict[str, Any]], shared: list[dict[str, Any]], users: list[bool]
) -> None:
    cluster = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "ml"},
         "spec": {"spec": {"devices": {"requests": template}}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ml"},
         "spec": {"devices": {"requests": shared}}},
    ]
    view = SnapshotView.from_objects(cluster)
    # containers marked True use both claims; the others none
    containers = [{"name": f"c{i}", "image": "x", **({"resources": {"claims": [{"name": "a"}, {"name": "b"}]}} if uses else {})}
                  for i, uses in enumerate(users)]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": containers, "resourceClaims": [{"name": "a", "resourceClaimTemplateName": "t"},
                                                                {"name": "b", "resourceClaimName": "c"}]}}
    gpus = _model(template) + _model(shared)
    validation = engine.evaluate(POLICY, Request.for_object(pod), view, "validate")
    assert validation.allowed is (gpus <= 6), (gpus, validation.message())
    mutation = engine.evaluate(POLICY, Request.for_object(pod), view, "mutate")
    # the pod holds its claims' GPUs (and lands on their node) whether or not a container uses them
    assert bool(mutation.patch) is (gpus > 0)
    for kind, requests in (("ResourceClaimTemplate", template), ("ResourceClaim", shared)):
        spec = {"devices": {"requests": copy.deepcopy(requests)}}
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "x", "namespace": "ml"},
               "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}
        decision = engine.evaluate(POLICY, Request.for_object(obj), view, "validate")
        assert decision.allowed is (_model(requests) <= 5), decision.message()


def _slice(node: str, devices: list[dict[str, Any]], basic: bool = False) -> dict[str, Any]:
    shaped = [{"name": d.pop("name"), **({"basic": {"attributes": d}} if basic else {"attributes": d})} for d in devices]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node}, "devices": shaped}}


def _gpu(name: str, driver: str, kind: str = "gpu") -> dict[str, Any]:
    # attributes as NVIDIA's gpu-kubelet-plugin publishes them (deviceinfo.go): driverVersion is a semver
    return {"name": name, "type": {"string": kind}, "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "driverVersion": {"version": driver}, "cudaDriverVersion": {"version": "12.8.0"}}


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"allocatable": {"cpu": "64"}}}


def test_driver_versions_come_from_resource_slices_for_nodes_without_gfd_labels() -> None:
    view = SnapshotView.from_objects([
        _node("a"), _node("b"), _node("c"), _node("d", **{"nvidia.com/cuda.driver-version.full": "535.104.05"}),
        _slice("a", [_gpu("gpu-0", "570.124.6"), _gpu("gpu-1", "570.124.6")]),
        _slice("b", [_gpu("gpu-0", "550.54.15")], basic=True),  # v1beta1 nests attributes under basic
        {**_slice("c", []), "spec": {"driver": "other.example.com", "nodeName": "c",
                                     "devices": [{"name": "x", "attributes": {"driverVersion": {"version": "1.0.0"}}}]}},
        _slice("d", [_gpu("gpu-0", "550.54.15")]),  # GFD's label wins where both are there
    ])
    drivers = {name: str(g.traits.driver) for g in view.node_groups() for name in g.members}
    assert drivers == {"a": "570.124.6", "b": "550.54.15", "c": "None", "d": "535.104.05"}
    devices = {name: dict(g.traits.devices) for g in view.node_groups() for name in g.members}
    assert devices["a"] == {("gpu.nvidia.com", "gpu"): 2, ("gpu.nvidia.com", ""): 2}
    assert devices["c"] == {("other.example.com", ""): 1}


def test_a_pod_whose_gpus_come_from_claims_lands_only_where_devices_of_its_class_are() -> None:
    """CPU nodes publish no GPU devices: they are not where a DRA GPU pod could run, so they
    neither count as nodes without a driver label nor soften a denial into a warning."""
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "two", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
                                    "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "two"}]}}
    old = [_gpu("gpu-0", "535.104.5"), _gpu("gpu-1", "535.104.5")]
    cluster = [template, _node("cpu-0"), _node("cpu-1"), _node("one-new-gpu"), _node("old"),
               _slice("one-new-gpu", [_gpu("gpu-0", "570.124.6")]), _slice("old", old)]
    decision = engine.evaluate(shipped_policies(), Request.for_object(pod), SnapshotView.from_objects(cluster), "validate")
    # only "old" publishes two GPUs; the CPU nodes and the one-GPU node are not where it could run
    assert not decision.allowed
    assert "the newest driver on the 1 node(s) it could land on is 535.104.5" in decision.message()
    more = [*cluster, _node("new"), _slice("new", [_gpu("gpu-0", "570.124.6"), _gpu("gpu-1", "570.124.6")])]
    # one of two can run it, and no label tells which (their drivers are known from their devices only)
    partial = engine.evaluate(shipped_policies(), Request.for_object(pod), SnapshotView.from_objects(more), "validate")
    assert not partial.allowed
    assert "only 1 of 2 node(s) it could land on have it" in partial.message()
    assert "no node affinity could steer it onto them" in partial.message()


def test_allocation_mode_all_counts_the_largest_node() -> None:
    slices = [_slice("a", [_gpu(f"gpu-{i}", "570.124.6") for i in range(8)] + [_gpu("mig-0", "570.124.6", "mig")]),
              _slice("b", [_gpu("gpu-0", "570.124.6")])]
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "all", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "all"}]}}
    decision = engine.evaluate(POLICY, Request.for_object(pod), SnapshotView.from_objects([*slices, template]), "validate")
    assert "asks for 8 nvidia.com/gpu in one pod" in decision.message()  # node a's 8 GPUs, its MIG device aside
    without_slices = engine.evaluate(POLICY, Request.for_object(pod), SnapshotView.from_objects([template]), "validate")
    assert without_slices.allowed  # unknown: counted as 1


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 9) | st.sampled_from(["All", "gpu.nvidia.com", "x", ""]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["name", "exactly", "firstAvailable", "deviceClassName", "count",
                                         "allocationMode", "adminAccess", "selectors", "cel", "expression",
                                         "requests", "devices", "spec"]), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=JSON, claims=JSON)
def test_malformed_claims_and_pods_never_break_the_engine(spec: Any, claims: Any) -> None:
    """Whatever shape a claim or a pod's resourceClaims has (an API server in front, or the audit CLI
    reading any file), the engine answers; it never raises."""
    policies = shipped_policies()
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "ml"}, "spec": {"spec": spec}}
    view = SnapshotView.from_objects([template])
    for phase in ("mutate", "validate"):
        engine.evaluate(policies, Request.for_object(template), view, phase)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
               "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": claims}}],
                        "resourceClaims": [{"name": "a", "resourceClaimTemplateName": "t"}, claims]}}
        engine.evaluate(policies, Request.for_object(pod), view, phase)


@pytest.mark.parametrize(("product", "runs"), [("NVIDIA A100-SXM4-80GB", True), ("NVIDIA GeForce RTX 4090", False)])
def test_forward_compatibility_reads_the_product_a_dra_node_publishes(product: str, runs: bool) -> None:
    """NGC PyTorch 24.01 (CUDA 12.3) runs on R535 through cuda-compat on data-center GPUs only; a node
    without GFD labels says which GPU it has through its devices' productName."""
    device = _gpu("gpu-0", "535.104.5")
    device["productName"] = {"string": product}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                    "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "one"}]}}
    view = SnapshotView.from_objects([template, _node("n"), _slice("n", [device])])
    decision = engine.evaluate(shipped_policies(), Request.for_object(pod), view, "validate")
    assert decision.allowed is runs, decision.message()


def test_a_relist_of_resource_slices_never_hides_a_published_device_from_a_reader() -> None:
    """Admission reads allocated devices without the index's lock: during a relist of the same
    slices, a device published before and after it is found all along."""
    from webhook.view.aggregates import Aggregates

    aggregates = Aggregates()
    slices = [_slice(f"n{i}", [_gpu("gpu-0", "570.124.6")]) for i in range(3)]
    for obj in slices:
        aggregates.put_slice(copy.deepcopy(obj))
    seen = []

    def relisted() -> Any:
        for obj in slices:
            seen.append(aggregates.published_device("gpu.nvidia.com", "n0", "gpu-0"))
            yield copy.deepcopy(obj)

    aggregates.replace_slices(relisted())
    assert seen and all(device is not None for device in seen), seen
    assert aggregates.published_device("gpu.nvidia.com", "n2", "gpu-0") is not None


def test_fitting_tries_alternatives_in_order_and_backtracks() -> None:
    room = {"a": 2, "b": 1}.__getitem__
    # the first alternative of each request that fits, in the scheduler's order
    assert dra.fitting([[("a", 16), ("a", 1)]], room) == {"a": 1}
    # the first request's first choice (a: 2) leaves no room for the second: back to its b
    assert dra.fitting([[("a", 2), ("b", 1)], [("a", 1)]], room) == {"b": 1, "a": 1}
    assert dra.fitting([[("a", 3), ("b", 2)]], room) is None
    assert dra.smallest([[("a", 16), ("a", 4)], [("b", 2), ("a", 3)]]) == {"a": 4, "b": 2}


def test_fitting_gives_up_as_fits_past_its_budget() -> None:
    # 32 requests of 8 alternatives none of which fits together: too many choices to try them all
    requests = [[("a", 1)] * 8 for _ in range(32)]
    assert dra.fitting(requests, {"a": 31}.__getitem__) == {}
    assert dra.fitting(requests[:3], {"a": 2}.__getitem__) is None

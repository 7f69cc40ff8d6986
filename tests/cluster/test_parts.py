"""The index's parts on their own: store snapshots, pod filter and trim, backoff, state."""

from __future__ import annotations

import random

import pytest

from webhook.cluster import Backoff, ResourceState, is_gpu_resource
from webhook.cluster.kinds import KINDS, shaper
from webhook.cluster.pods import requests_gpu, trim_pod
from webhook.cluster.store import Store
from webhook.view.protocol import KNOWN, Availability

from . import builders


def test_store_snapshots_are_never_changed_by_later_writes() -> None:
    store = Store()
    store.put(builders.pod("a", "ns1"))
    store.put(builders.pod("b", "ns1"))
    before = store.snapshot
    pods_before = before.in_namespace("ns1")
    all_before = before.all()
    store.put(builders.pod("c", "ns1"))
    store.discard("ns1", "a")
    store.put(builders.pod("d", "ns2"))
    assert sorted(p["metadata"]["name"] for p in pods_before) == ["a", "b"]
    assert len(all_before) == 2 and len(list(all_before)) == 2
    after = store.snapshot
    assert sorted(p["metadata"]["name"] for p in after.all()) == ["b", "c", "d"]
    assert after.size == len(after.all()) == 3


def test_store_forgets_empty_namespaces_and_replaces_wholesale() -> None:
    store = Store()
    store.put(builders.pod("a", "gone"))
    store.put(builders.pod("a", "kept"))
    store.discard("gone", "a")
    store.discard("gone", "a")  # twice: harmless
    assert set(store.snapshot.buckets) == {"kept"} and store.snapshot.size == 1
    store.replace([builders.pod("x", "new"), builders.pod("y", "new")])
    assert set(store.snapshot.buckets) == {"new"} and store.snapshot.size == 2
    assert store.snapshot.get("kept", "a") is None and store.snapshot.get("new", "x") is not None
    assert list(store.snapshot.in_namespace("missing")) == []


def test_store_put_replaces_an_object_of_the_same_name() -> None:
    store = Store()
    store.put(builders.pod("a", phase="Pending"))
    store.put(builders.pod("a", phase="Running"))
    (only,) = store.snapshot.all()
    assert only["status"]["phase"] == "Running" and store.snapshot.size == 1


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-1g.10gb.me", True),
        ("amd.com/gpu", True),
        ("gpu.intel.com/i915", True),
        ("gpu.intel.com/xe", True),
        ("nvidia.com/gpumem", False),
        ("cpu", False),
        ("memory", False),
        ("example.com/gpu", False),
    ],
)
def test_default_gpu_resources(name: str, gpu: bool) -> None:
    assert is_gpu_resource(name) is gpu


def test_requests_gpu_looks_at_requests_limits_and_init_containers() -> None:
    init_only = builders.pod("init", gpus=0)
    init_only["spec"]["initContainers"] = [{"name": "warmup", "resources": {"requests": {"amd.com/gpu": "1"}}}]
    assert requests_gpu(init_only)
    assert requests_gpu(builders.pod("limits"))
    assert not requests_gpu(builders.pod("cpu", gpus=0))
    assert not requests_gpu({"metadata": {"name": "empty"}})
    assert not requests_gpu({"spec": {"containers": [{"name": "c", "resources": None}]}})


def test_trim_pod_keeps_exactly_the_documented_fields() -> None:
    full = builders.pod("p", "ml", node="gpu-1")
    full["metadata"].update(uid="u1", ownerReferences=[{"kind": "Job", "name": "j"}], managedFields=[{}])
    full["spec"].update(priorityClassName="high", nodeSelector={"a": "b"}, affinity={"nodeAffinity": {}},
                        initContainers=[{"name": "i", "image": "x", "resources": {}}])  # fmt: skip
    trimmed = trim_pod(full)
    assert set(trimmed["metadata"]) == {"name", "namespace", "uid", "labels", "annotations", "ownerReferences"}
    assert set(trimmed["spec"]) == {"nodeName", "nodeSelector", "affinity", "tolerations", "priorityClassName",
                                    "containers", "initContainers"}  # fmt: skip
    assert trimmed["spec"]["initContainers"] == [{"name": "i"}]
    assert trimmed["status"] == {"phase": "Running"}
    assert "status" not in trim_pod({"metadata": {"name": "x"}, "spec": {}})


def test_non_pod_kinds_lose_managed_fields_and_node_images() -> None:
    node = builders.node("n")
    node["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    node["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}
    slim = shaper(KINDS["nodes"], is_gpu_resource)(node)
    assert slim is not None
    assert slim["kind"] == "Node" and slim["apiVersion"] == "v1"
    assert slim["metadata"]["annotations"] == {"keep": "me"} and "managedFields" not in slim["metadata"]
    assert set(slim["status"]) == {"capacity", "allocatable", "nodeInfo"}
    priority = shaper(KINDS["priorityclasses"], is_gpu_resource)({"metadata": {"name": "p"}, "value": 1})
    assert priority == {"metadata": {"name": "p"}, "value": 1, "kind": "PriorityClass",
                        "apiVersion": "scheduling.k8s.io/v1"}  # fmt: skip


def test_backoff_grows_to_the_cap_with_bounded_jitter() -> None:
    backoff = Backoff(initial=0.5, cap=30, factor=2, jitter=0.5)
    rng = random.Random(7)
    for attempt, base in enumerate([0.5, 1, 2, 4, 8, 16, 30, 30]):
        delays = [backoff.delay(attempt, rng) for _ in range(50)]
        assert all(base * 0.5 <= d <= base for d in delays)
        assert len(set(delays)) > 1  # jittered
    assert backoff.delay(10_000, rng) <= 30  # no overflow on long outages


def test_state_availability_reasons() -> None:
    now = 100.0
    assert ResourceState().availability("pods", now, 60) == Availability(False, "pods not synced yet")
    failing = ResourceState(error="list failing (HTTP 403)")
    assert failing.availability("pods", now, 60).reason == "pods not synced yet: list failing (HTTP 403)"
    synced = ResourceState(synced=True, last_success=50.0)
    assert synced.availability("pods", now, 60) == KNOWN  # quiet, not failing: fine however old
    broken = ResourceState(synced=True, last_success=30.0, error="watch failing (timed out)")
    assert broken.availability("nodes", now, 60) == Availability(False, "nodes stale for 70s: watch failing (timed out)")
    assert broken.availability("nodes", now, 90) == KNOWN
    assert ResourceState(watched=False).availability("nodes", now, 60).known is False

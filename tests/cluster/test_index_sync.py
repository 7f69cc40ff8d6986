"""The index lists in pages, keeps what policies need, and follows every change."""

from __future__ import annotations

import pytest

from tests.fakeapi import FakeApiServer, iter_requests
from webhook.cluster import ClusterIndex
from webhook.view.protocol import KNOWN, ClusterView

from . import builders
from .builders import names as _names
from .conftest import FAST, MakeIndex
from .polling import eventually


def test_an_unstarted_index_is_an_empty_unknown_view(api: FakeApiServer) -> None:
    view: ClusterView = ClusterIndex(api.api_client())  # mypy checks the Protocol here
    assert all(not view.availability(r).known for r in ("nodes", "pods", "runtimeclasses"))
    assert view.namespace("default") is None and view.priority_class("x") is None
    assert list(view.nodes()) == list(view.pods()) == list(view.pods("default")) == []
    assert list(view.resource_quotas("default")) == [] and view.runtime_class("x") is None
    assert api.requests() == []


async def test_initial_sync_is_paginated_and_keeps_only_gpu_pods(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    api.add_many(builders.pod(f"p{i:04}", gpus=i % 2) for i in range(1200))
    index = await make_index()
    assert await index.wait_synced(10)
    lists = api.requests(path_contains="/api/v1/pods", watch=False)
    assert len(lists) == 3
    assert {r.query["limit"] for r in lists} == {"500"}
    assert "continue" not in lists[0].query
    assert len(list(iter_requests(lists, "continue"))) == 2
    assert len(index.pods()) == len(index.pods("default")) == 600
    assert _names(index.pods()) == {f"p{i:04}" for i in range(1, 1200, 2)}
    assert index.state("pods").relists == 0 and index.availability("pods") == KNOWN


async def test_pods_are_trimmed_to_what_policies_read(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.namespace("ml"))
    api.add(builders.pod("train", "ml", node="gpu-1"))
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    (kept,) = index.pods("ml")
    assert kept["kind"] == "Pod" and set(kept) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert set(kept["metadata"]) == {"name", "namespace", "uid", "labels", "annotations"}
    assert kept["metadata"]["annotations"] == {"team": "ml"}  # last-applied-configuration dropped
    assert set(kept["spec"]) == {"nodeName", "tolerations", "containers"}
    assert kept["spec"]["containers"] == [
        {"name": "main", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                       "limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}}}]  # fmt: skip
    assert kept["status"] == {"phase": "Running"}


async def test_other_kinds_are_served_without_bulky_fields(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.namespace("ml", **{"gpu-admission.io/enabled": "true"}))
    api.add(builders.node("gpu-1"))
    api.add(builders.quota("gpus", "ml", 8))
    api.add(builders.priority_class("training", 1000))
    api.add(builders.runtime_class("nvidia"))
    index = await make_index()
    assert await index.wait_synced(5)
    namespace = index.namespace("ml")
    assert namespace is not None and namespace["metadata"]["labels"]["gpu-admission.io/enabled"] == "true"
    assert namespace["kind"] == "Namespace" and "managedFields" not in namespace["metadata"]
    (node,) = index.nodes()
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert "images" not in node["status"] and node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert [q["spec"]["hard"] for q in index.resource_quotas("ml")] == [{"requests.nvidia.com/gpu": "8"}]
    assert list(index.resource_quotas("default")) == []
    priority = index.priority_class("training")
    assert priority is not None and priority["value"] == 1000
    runtime = index.runtime_class("nvidia")
    assert runtime is not None and runtime["handler"] == "nvidia"
    assert index.priority_class("absent") is None and index.runtime_class("absent") is None
    assert index.namespace("absent") is None


async def test_follows_added_modified_deleted(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.pod("a"))
    api.add(builders.node("n1"))
    index = await make_index()
    assert await index.wait_synced(5)
    api.add(builders.pod("b"))
    api.add(builders.pod("cpu-only", gpus=0))
    api.modify(builders.pod("a", phase="Succeeded"))
    api.delete("Node", "n1")
    api.add(builders.node("n2", driver="570.124.06"))
    api.add(builders.namespace("late"))
    await eventually(lambda: _names(index.pods()) == {"a", "b"}, what="pods a and b")
    await eventually(lambda: [p["status"]["phase"] for p in index.pods() if p["metadata"]["name"] == "a"]
                     == ["Succeeded"], what="pod a modified")  # fmt: skip
    await eventually(lambda: _names(index.nodes()) == {"n2"}, what="node n1 replaced by n2")
    await eventually(lambda: index.namespace("late") is not None, what="namespace late")
    api.delete("Pod", "a", "default")
    api.delete("Pod", "b", "default")
    await eventually(lambda: len(index.pods()) == 0, what="all pods deleted")
    assert index.state("pods").relists == 0 and index.state("pods").watch_errors == 0


async def test_custom_gpu_predicate(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.pod("hami", resource="nvidia.com/gpumem"))
    api.add(builders.pod("mig", resource="nvidia.com/mig-1g.10gb"))
    api.add(builders.pod("intel", resource="gpu.intel.com/i915"))
    default = await make_index(resources=["pods"])
    custom = await make_index(resources=["pods"], is_gpu_resource=lambda name: name == "nvidia.com/gpumem")
    assert await default.wait_synced(5) and await custom.wait_synced(5)
    assert _names(default.pods()) == {"mig", "intel"}
    assert _names(custom.pods()) == {"hami"}


async def test_watches_only_the_resources_asked_for(api: FakeApiServer, make_index: MakeIndex) -> None:
    index = await make_index(resources=["nodes", "namespaces"])
    assert await index.wait_synced(5)
    assert index.resources == {"nodes", "namespaces"}
    assert {r.path for r in api.requests()} == {"/api/v1/nodes", "/api/v1/namespaces"}
    assert index.synced() and index.synced(["nodes"]) and not index.synced(["pods"])
    assert index.availability("pods").known is False
    assert index.availability("pods").reason == "pods not watched (no loaded policy needs them)"
    assert list(index.pods()) == [] and index.priority_class("x") is None


def test_unknown_resource_is_refused(api: FakeApiServer) -> None:
    with pytest.raises(ValueError, match="cannot watch deployments"):
        ClusterIndex(api.api_client(), resources=["pods", "deployments"])  # type: ignore[list-item]


async def test_not_synced_before_start(api: FakeApiServer, make_index: MakeIndex) -> None:
    index = await make_index(start=False)
    assert not index.synced()
    assert index.availability("nodes").reason == "nodes not synced yet"
    assert not await index.wait_synced(0.05)
    assert FAST.page_size == 500  # the documented default the pagination test relies on

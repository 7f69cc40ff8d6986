"""The index and DRA: claims, templates, classes and slices watched; pods naming claims kept; discovery."""

from __future__ import annotations

from typing import Any

from tests.fakeapi import FakeApiServer
from webhook.cluster.discovery import served_resources
from webhook.view.protocol import DRA_RESOURCES, RESOURCES

from . import builders
from .conftest import MakeIndex

V1 = "resource.k8s.io/v1"


def _claim(name: str, namespace: str = "ml", reserved: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": V1, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(reserved)],
        },
    }


async def test_dra_objects_are_watched_and_claims_slimmed(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.namespace("ml"))
    api.add({"apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}, "spec": {}})
    api.add({"apiVersion": V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "ml"},
             "spec": {"spec": {"devices": {"requests": []}}}})
    api.add(_claim("shared", reserved=500))
    api.add({"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "node-1-gpus"},
             "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-1", "pool": {"name": "node-1"}, "devices": []}})
    index = await make_index(resources=DRA_RESOURCES)
    assert await index.wait_synced(5)
    assert index.device_class("gpu.nvidia.com") is not None
    assert index.resource_claim_template("ml", "t") is not None and index.resource_claim_template("x", "t") is None
    claim = index.resource_claim("ml", "shared")
    assert claim is not None and claim["kind"] == "ResourceClaim"
    # the allocation stays (which device it got); the list of pods using it does not
    assert set(claim["status"]) == {"allocation"}
    assert [s["metadata"]["name"] for s in index.resource_slices()] == ["node-1-gpus"]


async def test_pods_naming_claims_are_kept_with_their_claims(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.namespace("ml"))
    claims = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    api.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra", "namespace": "ml"},
             "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                      "resourceClaims": claims}})
    api.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu", "namespace": "ml"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}})
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    (kept,) = index.pods("ml")
    assert kept["metadata"]["name"] == "dra"
    assert kept["spec"]["resourceClaims"] == claims
    assert kept["spec"]["containers"] == [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]


def test_a_cluster_without_resource_k8s_io_v1_is_not_asked_for_it(api: FakeApiServer) -> None:
    # the fake, like kube-apiserver before 1.34, has no discovery document for resource.k8s.io/v1
    served = served_resources(api.api_client())
    assert set(served) == set(RESOURCES) - set(DRA_RESOURCES)


def test_when_discovery_fails_every_resource_is_watched(api: FakeApiServer) -> None:
    api.fail_next(1, path_contains="/apis/resource.k8s.io/v1")
    assert served_resources(api.api_client()) == RESOURCES

"""A ResourceClaim shared by several pods counts once under a GPU cap (issues #41, #42), through the real
kube-apiserver with deploy/'s webhooks and the charge ledger.

A namespace under a cap of 4 GPUs (e2e-claims-cap, tests/e2e/fixtures.py): two pods naming one
4-device ResourceClaim are both stored (the scheduler allocates the claim once, for both), created at
the same moment so that the ledger, not the cluster view, judges the second; a pod with a 1-device
claim of its own is then refused, until the last pod naming the shared claim is gone. The control:
two pods with 4-device claims of their own fill the cap each, one is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest

from tests.e2e.admission import Admission
from tests.e2e.conftest import ALLOW_CLASSES, OPT_IN
from tests.e2e.fixtures import CLAIMS_CAP_LABEL, charged, register_node, wait_for_view
from tests.e2e.kube import Kube, Object, Refused, eventually
from tests.e2e.test_dra import (  # noqa: F401 (fixtures)
    DENIED, V1, _admitted, _claim, _dra_node, _dra_served, _gpu_slice, device_class,
)
from tests.e2e.test_quota_burst import create_at_once

CAPPED = {CLAIMS_CAP_LABEL: "on"}


def _pod(name: str, namespace: str, claim: str) -> Object:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                     "resources": {"claims": [{"name": "gpu"}], "limits": {"memory": "8Gi"}}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


def _at_once(admin: Kube, pods: list[Object]) -> tuple[list[str], list[str]]:
    """Every pod created at the same moment: (the names stored, the refusals)."""
    stored, refusals = create_at_once(admin, pods)
    return sorted(str(p["metadata"]["name"]) for p in stored), refusals


def _claims(admin: Kube, admission: Admission, namespace: str, **devices: int) -> None:
    for name, count in devices.items():
        admin.create(_claim(name, namespace, count))
    wait_for_view(admin, admission, "resourceclaims", V1, "ResourceClaim")


@pytest.fixture
def capped(admin: Kube, admission: Admission) -> Iterator[str]:
    """A fresh opted-in namespace under the cap of 4 GPUs, and a node publishing 8 GPUs (other tests'
    nodes may publish fewer: a 4-device claim must fit one node, or draClaims refuses it)."""
    name = f"e2e-claims-{uuid.uuid4().hex[:8]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {OPT_IN: "true", **ALLOW_CLASSES, **CAPPED}}})
    pool = f"dra-{uuid.uuid4().hex[:6]}"
    register_node(admin, admission, _dra_node(f"{pool}-gpu", pool), ready=True)
    admin.create(_gpu_slice(f"{pool}-gpu", "570.124.6", gpus=8))
    wait_for_view(admin, admission, "resourceslices", V1, "ResourceSlice")
    yield name
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    admin.delete({"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": f"{pool}-gpu-gpu.nvidia.com"}})
    admin.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{pool}-gpu"}})


def test_two_pods_sharing_a_claim_fill_the_cap_once_and_a_third_pod_is_refused(
    admin: Kube, admission: Admission, capped: str, device_class: Object
) -> None:
    _claims(admin, admission, capped, shared=4, mine=1)
    before = admission.view_count("pods")
    stored, refusals = _at_once(admin, [_pod("a", capped, "shared"), _pod("b", capped, "shared")])
    assert stored == ["a", "b"], refusals  # (before: one refused, "uses 4 of 4 nvidia.com/gpu; this pod asks for 4")
    # each pod's line holds the claim's devices, and names the claim they come from
    lines = charged(admin, capped)
    assert sorted(e.holding.name for e in lines.values()) == ["a", "b"]
    for entry in lines.values():
        assert entry.holding.gpus == (("nvidia.com/gpu", Decimal(4)),)
        assert entry.holding.claims == (("shared", (("nvidia.com/gpu", Decimal(4)),)),)

    # once the cluster view holds them, its check counts the claim once too
    eventually(lambda: admission.view_count("pods") == before + 2, what="the cluster view holding pods a and b")
    admin.create(_pod("d", capped, "shared"))
    with pytest.raises(Refused) as refused:
        admin.create(_pod("c", capped, "mine"))
    assert DENIED in refused.value.message
    assert f"namespace {capped} uses 4 of 4 nvidia.com/gpu; this pod asks for 1" in refused.value.message, \
        refused.value.message

    # the claim is held while any pod naming it is: a and d go, b still holds its 4 devices
    admin.delete(_pod("a", capped, "shared"))
    admin.delete(_pod("d", capped, "shared"))
    eventually(lambda: sorted(e.holding.name for e in charged(admin, capped).values()) == ["b"],
               what="the charges of pods a and d released")
    assert not _admitted(admin, _pod("c", capped, "mine"))
    # and released with the last
    admin.delete(_pod("b", capped, "shared"))
    eventually(lambda: _admitted(admin, _pod("c", capped, "mine")), what="the shared claim's devices released")
    admin.create(_pod("c", capped, "mine"))
    assert [p["metadata"]["name"] for p in admin.list("v1", "Pod", capped)] == ["c"]


def test_pods_with_claims_of_their_own_still_fill_the_cap_each(
    admin: Kube, admission: Admission, capped: str, device_class: Object
) -> None:
    _claims(admin, admission, capped, **{"a-gpus": 4, "b-gpus": 4})
    stored, refusals = _at_once(admin, [_pod("a", capped, "a-gpus"), _pod("b", capped, "b-gpus")])
    assert len(stored) == 1, stored
    (message,) = refusals
    assert DENIED in message and f"namespace {capped} uses 4 of 4 nvidia.com/gpu; this pod asks for 4" in message, \
        message
    assert [p["metadata"]["name"] for p in admin.list("v1", "Pod", capped)] == stored

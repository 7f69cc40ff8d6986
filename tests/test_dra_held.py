"""DRA by what a pod holds (issue #41): existing pods count the ResourceClaims named in their status.

A pod made from a ResourceClaimTemplate holds the claim the resourceclaim
controller made for it (``status.resourceClaimStatuses``); the template may be
gone. The quota rule (against the view) and the recount (the engine judging
an existing pod) count that claim; a ResourceClaim several pods share counts once.
"""

from __future__ import annotations

from typing import Any

from tests.support import cap_of_4_policies
from webhook.ledger import recount
from webhook.policy import engine, loader
from webhook.policy.charges import LedgerKey
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

KEY = LedgerKey("namespace", "ml", "", "nvidia.com/gpu.product")
CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


def _claim(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                        "count": gpus}}]}}}


def _pod(name: str, pod_claim: dict[str, str], held: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [{"name": "gpu", **pod_claim}],
                 "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]},
        "status": {"phase": "Running"}}
    if held:
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": held}]
    return pod


def _policies() -> loader.PolicySet:
    return cap_of_4_policies()


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}


def test_a_pod_whose_template_is_gone_counts_the_claim_it_holds() -> None:
    # the template "gone" was deleted; the pod holds the 2-GPU claim made from it
    view = SnapshotView.from_objects([NAMESPACE, CLASS, _claim("trainer-gpu-x7", 2),
                                      _pod("trainer", {"resourceClaimTemplateName": "gone"}, "trainer-gpu-x7")])
    held = recount.holdings(_policies(), view, KEY, ["ml"], None)
    assert set(held) == {"uid-trainer"}
    assert dict(held["uid-trainer"].gpus) == {"nvidia.com/gpu": 2}
    new = _pod("new", {"resourceClaimName": "more"})
    objects = [NAMESPACE, CLASS, _claim("trainer-gpu-x7", 2), _claim("more", 3),
               _pod("trainer", {"resourceClaimTemplateName": "gone"}, "trainer-gpu-x7")]
    decision = engine.evaluate(_policies(), Request.for_object(new), SnapshotView.from_objects(objects), "validate")
    assert "namespace ml uses 2 of 4 nvidia.com/gpu; this pod asks for 3" in decision.message()


def test_a_claim_shared_by_several_pods_counts_once() -> None:
    objects = [NAMESPACE, CLASS, _claim("shared", 2), _claim("more", 2),
               _pod("a", {"resourceClaimName": "shared"}), _pod("b", {"resourceClaimName": "shared"}),
               _pod("c", {"resourceClaimTemplateName": "t"}, "shared")]
    decision = engine.evaluate(_policies(), Request.for_object(_pod("new", {"resourceClaimName": "more"})),
                               SnapshotView.from_objects(objects), "validate")
    assert decision.allowed, decision.message()  # 2 (shared, once) + 2 of 4

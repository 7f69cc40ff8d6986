"""Native ResourceQuotas in the audit: a pod that exists is already in ``status.used``.

A namespace exactly at its quota holds the pods the quota counts; judging one
of them must not add its GPUs a second time. A new pod (a manifest the
cluster does not have, or an admission: a uid of its own) still is.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook import cli
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: quotas}
spec:
  match: {kinds: [Pod]}
  rules:
    quota: {mode: enforce, resourceQuotas: true}
"""
UID = "11111111-1111-1111-1111-111111111111"
GPU_POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "q", "uid": UID},
    "spec": {"containers": [{"name": "c", "image": "ubuntu:22.04",
                             "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]},
    "status": {"phase": "Running"},
}
DRA_POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "d", "namespace": "q", "uid": "22222222-2222-2222-2222-222222222222"},
    "spec": {"containers": [{"name": "c", "image": "ubuntu:22.04", "resources": {"claims": [{"name": "gpu"}]}}],
             "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
    "status": {"phase": "Running"},
}
DRA_ITEM = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


def _state(*pods: dict[str, Any]) -> list[dict[str, Any]]:
    """Namespace q at 1 of 1 GPU and 1 of 1 DRA GPU device: the pods given hold them."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "q"}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": "q"},
         "spec": {"hard": {"requests.nvidia.com/gpu": "1", DRA_ITEM: "1"}},
         "status": {"hard": {"requests.nvidia.com/gpu": "1", DRA_ITEM: "1"},
                    "used": {"requests.nvidia.com/gpu": "1", DRA_ITEM: "1"}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "one-gpu", "namespace": "q"},
         "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}},
        *pods,
    ]


def _audit(tmp_path: Path, capsys: pytest.CaptureFixture[str], state: list[dict[str, Any]],
           manifest: dict[str, Any]) -> tuple[int, str]:
    (tmp_path / "pol").mkdir(exist_ok=True)
    (tmp_path / "pol" / "quotas.yaml").write_text(POLICY)
    (tmp_path / "state.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": state}))
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(manifest))
    code = cli.main(["audit", "--policies", str(tmp_path / "pol"), "--cluster-state", str(tmp_path / "state.yaml"),
                     str(tmp_path / "pod.yaml")])
    return code, capsys.readouterr().out


def _renamed(pod: dict[str, Any], name: str, uid: str | None) -> dict[str, Any]:
    other = copy.deepcopy(pod)
    other["metadata"]["name"] = name
    if uid is None:
        del other["metadata"]["uid"]
    else:
        other["metadata"]["uid"] = uid
    return other


@pytest.mark.parametrize("pod", [GPU_POD, DRA_POD], ids=["extended", "dra"])
def test_an_existing_pod_of_a_namespace_at_its_quota_is_not_over_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pod: dict[str, Any]
) -> None:
    code, out = _audit(tmp_path, capsys, _state(pod), pod)
    assert code == 0 and "ResourceQuota" not in out, out
    # the same pod as a manifest without its uid (kubectl get -o yaml, cleaned) is the same pod
    code, out = _audit(tmp_path, capsys, _state(pod), _renamed(pod, pod["metadata"]["name"], None))
    assert code == 0 and "ResourceQuota" not in out, out


@pytest.mark.parametrize("pod,item", [(GPU_POD, "requests.nvidia.com/gpu"), (DRA_POD, DRA_ITEM)], ids=["extended", "dra"])
def test_a_new_pod_of_a_namespace_at_its_quota_is_over_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pod: dict[str, Any], item: str
) -> None:
    code, out = _audit(tmp_path, capsys, _state(pod), _renamed(pod, "new", None))
    assert code == 1 and f"uses 1 of 1 {item} (ResourceQuota gpus); this pod asks for 1" in out, out
    # a pod the cluster no longer runs does not make its name's newcomer part of the use
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    code, out = _audit(tmp_path, capsys, _state(done), _renamed(pod, pod["metadata"]["name"], None))
    assert code == 1 and f"uses 1 of 1 {item}" in out, out


def test_admission_of_a_pod_named_as_one_the_view_still_has_is_unchanged() -> None:
    """kube-apiserver gives a created pod a uid of its own before the validating webhook sees it:
    a pod of the view under the same name (a StatefulSet's replacement, a stale view) is another."""
    policies = loader.load_text(POLICY)
    view = SnapshotView.from_objects(_state(GPU_POD))
    created = _renamed(GPU_POD, "p", "33333333-3333-3333-3333-333333333333")
    del created["status"]
    decision = engine.evaluate(policies, Request.for_object(created), view, "validate")
    assert not decision.allowed
    assert any("uses 1 of 1 requests.nvidia.com/gpu" in f.message for f in decision.findings), decision.findings
    same = copy.deepcopy(GPU_POD)
    assert engine.evaluate(policies, Request.for_object(same), view, "validate").allowed

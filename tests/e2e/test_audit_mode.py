"""A rule in audit mode through kube-apiserver: the pod is stored, and its audit event says what the rule found."""

from __future__ import annotations

import json

import pytest

from tests.e2e.apiserver import ApiServer
from tests.e2e.fixtures import AUDIT_LABEL, gpu_container, pod
from tests.e2e.kube import Kube, eventually

#: the key kube-apiserver stores: the webhook's name, "/", the key gpu-admission answers
AUDIT_KEY = "validate.gpu-admission.io/audit-findings"


@pytest.mark.parametrize("namespace", [{AUDIT_LABEL: "on"}], indirect=True)
def test_an_audit_mode_finding_admits_the_pod_and_reaches_the_apiserver_audit_log(
    admin: Kube, apiserver: ApiServer, namespace: str,
) -> None:
    admin.create(pod("audited", namespace, gpu_container()))
    assert [p["metadata"]["name"] for p in admin.list("v1", "Pod", namespace)] == ["audited"]
    event = eventually(lambda: apiserver.create_event(namespace, "audited"), what="the pod's audit event")
    annotations = event.get("annotations") or {}
    # kube-apiserver drops (with a warning in its log) a key that is not a qualified name: here it was kept
    assert AUDIT_KEY in annotations, annotations
    # only the audit-mode violation: the shipped cudaDriver's note that no known node matched, so no
    # driver was checked, is no finding
    (finding,) = json.loads(annotations[AUDIT_KEY])
    assert finding.startswith("[e2e-audit/resourceShape] "), finding
    assert f"Pod {namespace}/audited: asks for 1 nvidia.com/gpu in one pod; the policy allows at most 0 per pod" in finding


@pytest.mark.parametrize("namespace", [{AUDIT_LABEL: "on"}], indirect=True)
def test_a_pod_without_audit_findings_has_no_audit_annotation(admin: Kube, apiserver: ApiServer, namespace: str) -> None:
    admin.create(pod("plain", namespace, gpu_container(gpus=None)))  # no GPU: no rule finds anything
    event = eventually(lambda: apiserver.create_event(namespace, "plain"), what="the pod's audit event")
    assert AUDIT_KEY not in (event.get("annotations") or {}), event

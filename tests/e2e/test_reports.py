"""gpu-admission report through the real apiserver: the PolicyReport CRD installed from deploy/reports/crds,
the command run (as a process, with the token of deploy/reports' ServiceAccount) twice over namespaces of
compliant and non-compliant GPU workloads; a user without the verbs cannot write reports."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.admission import DEPLOY, NAMESPACE, Admission
from tests.e2e.apiserver import REPO, ApiServer
from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import deployment, gpu_container, pod
from tests.e2e.kube import Kube, Object, documents, eventually

REPORTS = DEPLOY / "reports"
GROUP, VERSION = "wgpolicyk8s.io", "v1alpha2"
#: no node could ever run this: resourceShape refuses it (kube-apiserver accepts it: the quantity is an integer)
INVALID_MIG = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-9g.99gb": 1}}}
#: a whole GPU whose image states no CUDA: compliant whatever drivers the suite's nodes have
NO_CUDA = {"gpu-admission.io/cuda-version": "none"}


def _token(admin: Kube, account: str) -> str:
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = admin.core.create_namespaced_service_account_token(account, NAMESPACE, request)
    assert token.status is not None
    return str(token.status.token)


@pytest.fixture(scope="module")
def reporter(admin: Kube, admission: Admission, apiserver: ApiServer, workdir: Path) -> Path:
    """A kubeconfig of deploy/reports' ServiceAccount, its CRDs and RBAC applied."""
    for name in ("wgpolicyk8s.io_policyreports.yaml", "wgpolicyk8s.io_clusterpolicyreports.yaml"):
        for crd in documents(REPORTS / "crds" / name):
            admin.ensure(crd)
    custom = client.CustomObjectsApi(admin.api)
    eventually(lambda: _served(custom), what="the PolicyReport CRD being served")
    for obj in documents(REPORTS / "rbac.yaml"):
        admin.ensure(obj)
    return apiserver.kubeconfig(workdir / "report.kubeconfig", _token(admin, "gpu-admission-report"))


def _served(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, "clusterpolicyreports")
        custom.list_custom_object_for_all_namespaces(GROUP, VERSION, "policyreports")
    except client.exceptions.ApiException:
        return False
    return True


@pytest.fixture
def namespaces(admin: Kube) -> Iterator[list[str]]:
    """Two fresh namespaces, not opted in yet: what they hold is never refused by the webhooks on the way in."""
    names = [f"e2e-report-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name in names:
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield names
    for name in names:
        admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _report(kubeconfig: Path, policies: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "report", "--kubeconfig", str(kubeconfig),
                           "--policies", str(policies), "--page-size", "3"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip


def _reports(admin: Kube, namespace: str) -> list[dict[str, Any]]:
    listed = client.CustomObjectsApi(admin.api).list_namespaced_custom_object(GROUP, VERSION, namespace, "policyreports")
    assert isinstance(listed, dict)
    return list(listed["items"])


def _failing(report: dict[str, Any]) -> set[str]:
    return {f"{r['resources'][0]['kind']}/{r['resources'][0]['name']}" for r in report["results"] if r["result"] == "fail"}


def _with_annotations(obj: Object) -> Object:
    template = obj["spec"]["template"] if obj["kind"] != "Pod" else obj
    template.setdefault("metadata", {}).setdefault("annotations", {}).update(NO_CUDA)
    return obj


def test_reports_name_the_non_compliant_and_drop_the_fixed_and_the_deleted(
    admin: Kube, admission: Admission, reporter: Path, namespaces: list[str]
) -> None:
    first, second = namespaces
    admin.create(deployment("bad", first, INVALID_MIG))
    admin.create(_with_annotations(deployment("good", first, gpu_container())))
    admin.create(pod("bad-pod", second, INVALID_MIG))
    admin.create(_with_annotations(pod("good-pod", second, gpu_container())))
    for name in namespaces:  # opted in now: the report reads what the webhooks reach
        admin.patch({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                    {"metadata": {"labels": {OPT_IN: "true"}}})  # fmt: skip
    done = _report(reporter, admission.policies)
    assert done.returncode == 0, done.stdout + done.stderr
    (a,), (b,) = _reports(admin, first), _reports(admin, second)
    assert _failing(a) == {"Deployment/bad"} and _failing(b) == {"Pod/bad-pod"}
    assert {r["resources"][0]["name"] for r in a["results"]} == {"bad", "good"}
    assert a["metadata"]["name"] == "gpu-admission" and a["summary"]["fail"] >= 1
    assert {r["source"] for r in a["results"] + b["results"]} == {"gpu-admission"}
    # server-side apply, under our own field manager
    assert [f["manager"] for f in a["metadata"]["managedFields"]] == ["gpu-admission-report"]
    assert a["metadata"]["managedFields"][0]["operation"] == "Apply"

    # one fixed (now through the webhooks, which let a valid template in), one deleted
    fixed = _with_annotations(deployment("bad", first, gpu_container()))
    admin.replace(fixed)
    admin.delete(pod("bad-pod", second))
    done = _report(reporter, admission.policies)
    assert done.returncode == 0, done.stdout + done.stderr
    (a,), (b,) = _reports(admin, first), _reports(admin, second)
    assert _failing(a) == set() and _failing(b) == set()
    assert {r["resources"][0]["name"] for r in b["results"]} == {"good-pod"}
    assert {r["resources"][0]["name"] for r in a["results"]} == {"bad", "good"}  # the fixed one passes now
    # opted out: its report is no longer written, and loses its results (found by their metadata alone)
    admin.patch({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": second}},
                {"metadata": {"labels": {OPT_IN: None}}})  # fmt: skip
    done = _report(reporter, admission.policies)
    assert done.returncode == 0 and ", 1 emptied;" in done.stdout, done.stdout + done.stderr
    (b,) = _reports(admin, second)
    assert b["results"] == [] and b["metadata"]["annotations"]["gpu-admission.io/results"] == "0"
    assert _failing(_reports(admin, first)[0]) == set() and _reports(admin, first)[0]["results"]


def test_a_user_without_the_verbs_cannot_write_reports(admin: Kube, admission: Admission, reporter: Path,
                                                       namespaces: list[str], apiserver: ApiServer,
                                                       workdir: Path) -> None:  # fmt: skip
    # everything deploy/reports' role grants but the report kinds
    role = next(d for d in documents(REPORTS / "rbac.yaml") if d["kind"] == "ClusterRole")
    role["metadata"]["name"] = "e2e-report-reader"
    role["rules"] = [r for r in role["rules"] if r["apiGroups"] not in (["wgpolicyk8s.io"], ["openreports.io"])]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "e2e-report-reader", "namespace": NAMESPACE}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "e2e-report-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-report-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "e2e-report-reader", "namespace": NAMESPACE}],
    }  # fmt: skip
    for obj in (role, account, binding):
        admin.ensure(obj)
    try:
        first = namespaces[0]
        admin.create(deployment("bad", first, INVALID_MIG))
        admin.patch({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": first}},
                    {"metadata": {"labels": {OPT_IN: "true"}}})  # fmt: skip
        reader = apiserver.kubeconfig(workdir / "reader.kubeconfig", _token(admin, "e2e-report-reader"))
        done = _report(reader, admission.policies)
        assert done.returncode == 1, done.stdout + done.stderr
        assert (f'error: writing PolicyReport {first}/gpu-admission: HTTP 403: policyreports.wgpolicyk8s.io "gpu-admission" '
                f'is forbidden: User "system:serviceaccount:{NAMESPACE}:e2e-report-reader" cannot patch resource') in done.stderr
        assert _reports(admin, first) == []
        # the CronJob's own account may
        assert _report(reporter, admission.policies).returncode == 0
        assert _failing(_reports(admin, first)[0]) == {"Deployment/bad"}
    finally:
        for obj in (binding, account, role):
            admin.delete(obj)


def test_openreports_reports_are_stored_as_written(admin: Kube, admission: Admission, reporter: Path,
                                                   namespaces: list[str]) -> None:  # fmt: skip
    for name in ("openreports.io_reports.yaml", "openreports.io_clusterreports.yaml"):
        for crd in documents(REPORTS / "crds" / name):
            admin.ensure(crd)
    custom = client.CustomObjectsApi(admin.api)

    def served() -> bool:
        try:
            custom.list_custom_object_for_all_namespaces("openreports.io", "v1alpha1", "reports")
            custom.list_cluster_custom_object("openreports.io", "v1alpha1", "clusterreports")
        except client.exceptions.ApiException:
            return False
        return True

    eventually(served, what="the openreports.io Report CRD being served")
    first = namespaces[0]
    admin.create(pod("bad-pod", first, INVALID_MIG))
    admin.patch({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": first}},
                {"metadata": {"labels": {OPT_IN: "true"}}})  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "webhook", "report", "--api", "openreports", "--kubeconfig",
                           str(reporter), "--policies", str(admission.policies)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    listed = custom.list_namespaced_custom_object("openreports.io", "v1alpha1", first, "reports")
    assert isinstance(listed, dict)
    (report,) = listed["items"]
    # stored with every field we wrote (a field the schema does not know would have been pruned)
    assert report["source"] == "gpu-admission" and report["summary"]["fail"] >= 1
    assert _failing(report) == {"Pod/bad-pod"}
    assert {"timestamp", "severity", "category", "properties", "scored"} <= set(report["results"][0])


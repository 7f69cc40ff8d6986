"""gpu-admission report against the fake API server through the real kubernetes client: one PolicyReport per
namespace by server-side apply, results of objects gone or fixed removed, stale reports emptied."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.audit.support import TOO_NEW_POD
from tests.audit.test_cluster import _deployment, api, kubeconfig  # noqa: F401 - fixtures
from tests.fakeapi import FakeApiServer
from tests.support import POLICIES, assert_crashed, break_the_engine, invalid_policies
from webhook import cli
from webhook.audit import cluster_source
from webhook.audit.ledger import Ledger
from webhook.audit.report.policyreport import WGPOLICY

OPT_IN = {cluster_source.OPT_IN_LABEL: "true"}
#: a CUDA 12.2 image the example cluster's A100 drivers (535) run
GOOD_IMAGE = "nvcr.io/nvidia/pytorch:23.08-py3"


def _namespace(name: str, labels: dict[str, str] | None = None, terminating: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    if terminating:
        obj["status"] = {"phase": "Terminating"}
    return obj


def _pod(name: str, namespace: str, gpus: Any = 1) -> dict[str, Any]:
    pod = yaml.safe_load(TOO_NEW_POD)
    pod["metadata"] = {"name": name, "namespace": namespace}
    pod["spec"]["containers"][0]["image"] = GOOD_IMAGE
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return dict(pod)


@pytest.fixture(autouse=True)
def _runtime_class(api: FakeApiServer) -> None:  # noqa: F811
    """The RuntimeClass gpu-defaults sets (without it every GPU pod fails runtimeClass)."""
    api.add({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})


def _report(capsys: pytest.CaptureFixture[str], kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    code = cli.main(["report", "--kubeconfig", str(kubeconfig), "--page-size", "2", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _failing(report: dict[str, Any]) -> set[str]:
    return {f"{r['resources'][0]['kind']}/{r['resources'][0]['name']}" for r in report["results"] if r["result"] == "fail"}


def test_reports_name_the_non_compliant_and_follow_fixes_and_deletions(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    for name in ("team-a", "team-b"):
        api.add(_namespace(name, OPT_IN))
    api.add(_namespace("elsewhere"))
    api.add(_namespace("going", OPT_IN, terminating=True))
    api.add(_deployment("too-new", "team-a"))  # CUDA 12.4 on A100s whose driver is 535: denied
    api.add(_deployment("fine", "team-a", image=GOOD_IMAGE))
    api.add(_pod("half", "team-b", gpus="0.5"))
    api.add(_pod("whole", "team-b"))
    api.add(_pod("web", "team-b", gpus=None) | {"spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    api.add(_deployment("ignored", "elsewhere"))
    api.add(_deployment("ignored", "going"))
    code, out, err = _report(capsys, kubeconfig)
    assert code == 0, err
    # the CPU pod too: gpu-access-guard judges every pod (issue #42), and passes it
    assert out.startswith("2 PolicyReport(s) written (5 objects; ") and "0 emptied; 0 objects no rule applies to" in out, out
    reports = {r["metadata"]["namespace"]: r for r in api.objects("PolicyReport")}
    assert set(reports) == {"team-a", "team-b"}  # not the namespace not opted in, nor the one being deleted
    assert _failing(reports["team-a"]) == {"Deployment/too-new"} and _failing(reports["team-b"]) == {"Pod/half"}
    assert {r["rule"] for r in reports["team-b"]["results"]
            if r["resources"][0]["name"] == "web" and r["result"] != "skip"} == {"gpuAccess"}
    a = reports["team-a"]
    assert a["metadata"]["name"] == "gpu-admission"
    assert a["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-admission", "gpu-admission.io/report": "cluster"}
    assert {r["source"] for r in a["results"]} == {"gpu-admission"}
    assert a["summary"]["fail"] == sum(r["result"] == "fail" for r in a["results"]) >= 1
    named = {r["resources"][0]["name"] for r in a["results"]}
    assert named == {"too-new", "fine"}  # compliant objects carry their passes, as Kyverno reports them
    assert all(r["resources"][0]["uid"] for r in a["results"])
    # written by server-side apply under our field manager, one write per namespace
    writes = [r for r in api.requests(path_contains="/policyreports/") if r.method == "PATCH"]
    assert len(writes) == 2
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" and r.query["fieldManager"] == "gpu-admission-report"
               and r.query["force"] == "true" for r in writes)  # fmt: skip
    # pods are listed page by page for the view and again to judge them: never one whole list
    pod_lists = [r for r in api.requests(path_contains="/api/v1/pods") if not r.watch]
    assert all(r.query["limit"] == "2" for r in pod_lists) and sum("continue" not in r.query for r in pod_lists) == 2
    # the fake, like kube-apiserver before 1.34, serves no resource.k8s.io/v1: asked, and not listed
    assert api.requests(path_contains="/apis/resource.k8s.io/v1") and not api.requests(path_contains="/deviceclasses")

    # one fixed, one deleted; team-a's only workloads gone too, and a stale report of ours left over
    fixed = _deployment("too-new", "team-a", image=GOOD_IMAGE)
    api.modify(fixed)
    api.delete("Pod", "half", "team-b")
    code, out, err = _report(capsys, kubeconfig)
    assert code == 0, err
    reports = {r["metadata"]["namespace"]: r for r in api.objects("PolicyReport")}
    assert _failing(reports["team-a"]) == set() and _failing(reports["team-b"]) == set()
    assert "half" not in {r["resources"][0]["name"] for r in reports["team-b"]["results"]}
    assert {r["result"] for r in reports["team-a"]["results"] if r["resources"][0]["name"] == "too-new"} <= {"pass", "skip"}
    api.delete("Deployment", "too-new", "team-a")
    api.delete("Deployment", "fine", "team-a")
    code, out, _ = _report(capsys, kubeconfig)
    assert code == 0 and "1 emptied" in out
    reports = {r["metadata"]["namespace"]: r for r in api.objects("PolicyReport")}
    assert reports["team-a"]["results"] == [] and set(reports["team-a"]["summary"].values()) == {0}
    assert reports["team-b"]["results"]
    code, out, _ = _report(capsys, kubeconfig)  # an empty report is not written again
    assert code == 0 and "0 emptied" in out
    # old reports are found by their metadata: a report may weigh a megabyte
    listings = [r for r in api.requests(path_contains="/policyreports") if r.method == "GET"]
    assert listings and all("as=PartialObjectMetadataList" in r.headers["Accept"] for r in listings)


def test_the_notes_of_the_listing_are_said_as_audit_says_them(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """A charge of the GPU quota ledger whose pod is not stored yet counts as used, and is said (report
    said nothing of it); a ledger the account may not read is said too (charges in flight not counted)."""
    import time
    from decimal import Decimal

    from webhook.ledger import document
    from webhook.ledger.document import Entry
    from webhook.ledger.settings import LedgerSettings
    from webhook.policy.charges import Holding, LedgerKey

    api.add(_namespace("team-a", OPT_IN))
    api.add(_namespace(LedgerSettings.namespace))
    api.add(_pod("whole", "team-a"))
    key = LedgerKey("namespace", "team-a", "", "nvidia.com/gpu.product")
    coming = {"in-flight": Entry(Holding("team-a", "coming", "", None, (("nvidia.com/gpu", Decimal(1)),)), time.time())}
    api.add(document.new_object(key, LedgerSettings.namespace, coming) | {"apiVersion": f"{document.GROUP}/{document.VERSION}"})
    code, _, err = _report(capsys, kubeconfig)
    assert code == 0 and "note: GPU quota ledger: 1 charge in flight counted as used (pods admitted, not stored " \
                          "yet): team-a/coming" in err, err
    api.fail_next(1, 403, path_contains=f"/{document.PLURAL}")
    code, _, err = _report(capsys, kubeconfig)
    assert code == 0 and "charges in flight not counted" in err, err


def test_openreports_reports_carry_their_source(api: FakeApiServer, kubeconfig: Path,  # noqa: F811
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    api.add(_namespace("team-a", OPT_IN))
    api.add(_pod("half", "team-a", gpus="0.5"))
    code, out, err = _report(capsys, kubeconfig, "--api", "openreports")
    assert code == 0, err
    (report,) = api.objects("Report")
    assert report["apiVersion"] == "openreports.io/v1alpha1" and report["source"] == "gpu-admission"
    assert _failing(report) == {"Pod/half"} and api.objects("PolicyReport") == []


def test_a_refused_write_is_named_and_fails_the_run(api: FakeApiServer, kubeconfig: Path,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for name in ("team-a", "team-b"):
        api.add(_namespace(name, OPT_IN))
        api.add(_pod("half", name, gpus="0.5"))
    api.fail_next(1, 403, path_contains="/namespaces/team-a/policyreports/")
    code, out, err = _report(capsys, kubeconfig)
    assert code == 1
    assert "error: writing PolicyReport team-a/gpu-admission: HTTP 403" in err, err
    assert [r["metadata"]["namespace"] for r in api.objects("PolicyReport")] == ["team-b"]  # the others are written


def test_a_cluster_error_is_one_line_and_exit_1(api: FakeApiServer, kubeconfig: Path,  # noqa: F811
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert _report(capsys, kubeconfig, "--page-size", "0") == (1, "", "error: --page-size must be at least 1\n")


def test_an_invalid_policy_is_refused_with_file_and_field(api: FakeApiServer, kubeconfig: Path,  # noqa: F811
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, out, err = _report(capsys, kubeconfig, "--policies", str(invalid_policies(tmp_path / "policies")))
    assert code == 2 and out == "" and err.startswith("invalid policy:") and "gpu-defaults.yaml" in err and "mode" in err
    assert api.objects("PolicyReport") == []


def test_3_on_an_unexpected_error_in_one_line_and_the_traceback_with_debug(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    api.add(_namespace("team-a", OPT_IN))
    api.add(_pod("half", "team-a", gpus="0.5"))
    break_the_engine(monkeypatch)
    assert_crashed(lambda *args: _report(capsys, kubeconfig, *args))
    assert api.objects("PolicyReport") == []


def test_a_namespace_past_the_budget_is_split_between_objects() -> None:
    from webhook.audit.inputs import Document
    from webhook.audit.judge import judge, outcomes
    from webhook.policy import loader
    from webhook.view.snapshot import EMPTY_VIEW
    from tests.support import assert_crashed, break_the_engine, invalid_policies

    policies = loader.load_directory(POLICIES)
    ledger = Ledger()
    for n in range(6):
        doc = Document("cluster:team-a", n + 1, 0, copy.deepcopy(_pod(f"p{n}", "team-a", gpus="0.5")))
        result = judge(policies, EMPTY_VIEW, doc)
        assert result is not None
        ledger.add(result, outcomes(policies, EMPTY_VIEW, result))
    whole = list(ledger.reports("team-a", WGPOLICY, 0, budget=10**9))
    assert [r["metadata"]["name"] for r in whole] == ["gpu-admission"]
    for n in range(6):  # the ledger gave its records away: add them again
        doc = Document("cluster:team-a", n + 1, 0, copy.deepcopy(_pod(f"p{n}", "team-a", gpus="0.5")))
        result = judge(policies, EMPTY_VIEW, doc)
        assert result is not None
        ledger.add(result, outcomes(policies, EMPTY_VIEW, result))
    per_object = len(whole[0]["results"]) // 6
    split = list(ledger.reports("team-a", WGPOLICY, 0, budget=len(yaml.safe_dump(whole[0])) // 3))
    assert [r["metadata"]["name"] for r in split][:2] == ["gpu-admission", "gpu-admission-2"] and len(split) >= 3
    assert sum(len(r["results"]) for r in split) == len(whole[0]["results"])
    assert all(len(r["results"]) % per_object == 0 for r in split)  # no object's results split

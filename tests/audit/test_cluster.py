"""--cluster against the fake API server through the real kubernetes client: the view, pagination, running workloads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.audit.support import CLUSTER, TOO_NEW_POD, audit, write
from tests.fakeapi import FakeApiServer
from tests.support import REPO
from webhook.audit import cluster_source
from webhook.audit.packed import Packed


def _items(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((CLUSTER / name).read_text())["items"])


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """The example cluster (nodes, labelled namespaces, GPU pods, quotas) served by the fake."""
    with FakeApiServer() as server:
        for name in ("nodes.yaml", "namespaces.yaml", "pods.yaml", "quotas.yaml"):
            for obj in _items(name):
                obj["metadata"].pop("resourceVersion", None)
                if server.get(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace", "")) is None:
                    server.add(obj)
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> Path:
    return write(tmp_path / "kubeconfig", yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "users": [{"name": "dev", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "dev"}}],
    }))  # fmt: skip


def _deployment(name: str, namespace: str, image: str = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime") -> dict[str, Any]:
    pod = yaml.safe_load(TOO_NEW_POD)
    pod["spec"]["containers"][0]["image"] = image
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}},
        "status": {"replicas": 1},
    }  # fmt: skip


def test_the_live_cluster_decides_like_the_files_do(api: FakeApiServer, kubeconfig: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    pod = str(write(tmp_path / "p.yaml", TOO_NEW_POD))
    live = audit(capsys, "-o", "json", "--cluster", "--kubeconfig", str(kubeconfig), "--page-size", "2", pod)
    # the fake lists runtime and priority classes (none): the files say so with --complete
    files = audit(capsys, "-o", "json", "--cluster-state", str(CLUSTER), "--complete", "runtimeclasses",
                  "--complete", "priorityclasses", pod)
    assert live[0] == files[0] == 1
    assert json.loads(live[1])["results"] == json.loads(files[1])["results"]
    # every resource was listed page by page: a continue token on the second request of each
    node_lists = [r for r in api.requests(path_contains="/api/v1/nodes") if not r.watch]
    assert len(node_lists) >= 2 and node_lists[0].query["limit"] == "2" and "continue" in node_lists[1].query


def test_running_workloads_of_opted_in_namespaces_judged_as_if_created_now(
    api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opted_in = ["gpu-team"]
    api.add({"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "gpu-team", "labels": {cluster_source.OPT_IN_LABEL: "true"}}})  # fmt: skip
    api.add(_deployment("too-new", opted_in[0]))
    api.add(_deployment("elsewhere", "default"))
    owned = yaml.safe_load(TOO_NEW_POD) | {"metadata": {"name": "too-new-abc", "namespace": opted_in[0], "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "too-new-5d", "uid": "u1", "controller": True}]}}
    api.add(owned)
    api.add(yaml.safe_load(TOO_NEW_POD) | {"metadata": {"name": "bare", "namespace": opted_in[0]}})
    code, out, err = audit(capsys, "-o", "json", "--cluster", "--kubeconfig", str(kubeconfig), "--page-size", "1")
    results = json.loads(out)["results"]
    audited = {(r["kind"], r["namespace"], r["name"]) for r in results}
    assert {("Deployment", opted_in[0], "too-new"), ("Pod", opted_in[0], "bare")} <= audited
    assert not any(name in ("elsewhere", "too-new-abc") for _, _, name in audited)
    # pods are listed once, page by page, for the view; the audited ones kept packed for the audit
    pod_lists = [r for r in api.requests(path_contains="/api/v1/pods") if not r.watch]
    assert len(pod_lists) > 2 and sum("continue" not in r.query for r in pod_lists) == 1
    denied = next(r for r in results if r["name"] == "too-new")
    assert code == 1 and denied["verdict"] == "deny" and denied["source"] == f"cluster:{opted_in[0]}"
    assert not any(p["path"].startswith("/status") for p in denied["patch"])
    # no file to point at: SARIF names the object only
    _, out, _ = audit(capsys, "-o", "sarif", "--cluster", "--kubeconfig", str(kubeconfig))
    locations = [r["locations"] for r in json.loads(out)["runs"][0]["results"] if r["level"] == "error"]
    assert [{"logicalLocations": [{"fullyQualifiedName": f"Deployment {opted_in[0]}/too-new", "kind": "resource"}]}] in locations
    assert all("physicalLocation" not in location for found in locations for location in found)
    code, out, _ = audit(capsys, "-o", "json", "--cluster", "--kubeconfig", str(kubeconfig), "--all-namespaces")
    assert ("Deployment", "default", "elsewhere") in {(r["kind"], r["namespace"], r["name"]) for r in json.loads(out)["results"]}


def test_custom_kinds_the_cluster_does_not_serve_are_named(api: FakeApiServer, kubeconfig: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, _, err = audit(capsys, "--cluster", "--kubeconfig", str(kubeconfig))
    assert code == 0 and "note: kubeflow.org/PyTorchJob: not served by this cluster, not audited" in err


def test_core_workload_kinds_are_listed_not_called_unserved(api: FakeApiServer, kubeconfig: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    # every cluster serves PodTemplates and ReplicationControllers (core v1): their GPU templates are audited
    api.add({"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "gpu-team", "labels": {cluster_source.OPT_IN_LABEL: "true"}}})  # fmt: skip
    deployment = _deployment("legacy", "gpu-team")
    api.add({"apiVersion": "v1", "kind": "ReplicationController", "metadata": deployment["metadata"],
             "spec": {"selector": {"app": "legacy"}, "template": deployment["spec"]["template"]}})  # fmt: skip
    api.add({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tmpl", "namespace": "gpu-team"},
             "template": deployment["spec"]["template"]})  # fmt: skip
    code, out, err = audit(capsys, "-o", "json", "--cluster", "--kubeconfig", str(kubeconfig))
    assert "PodTemplate" not in err and "ReplicationController" not in err
    verdicts = {(r["kind"], r["name"]): r["verdict"] for r in json.loads(out)["results"]}
    assert verdicts == {("ReplicationController", "legacy"): "deny", ("PodTemplate", "tmpl"): "deny"}
    assert code == 1


def test_an_unreachable_or_failing_cluster_is_one_line(api: FakeApiServer, kubeconfig: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    api.fail_next(1, 403, path_contains="/api/v1/nodes")
    code, out, err = audit(capsys, "--cluster", "--kubeconfig", str(kubeconfig))
    assert (code, out) == (1, "") and err.startswith("error: listing nodes: HTTP 403: ") and err.count("\n") == 1
    code, _, err = audit(capsys, "--cluster", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1 and err.startswith("error: kubeconfig not found")
    nowhere = write(tmp_path / "nowhere", kubeconfig.read_text().replace(api.url, "http://127.0.0.1:9"))
    code, _, err = audit(capsys, "--cluster", "--kubeconfig", str(nowhere))
    assert code == 1 and err.startswith("error: listing nodes: cannot reach the API server") and err.count("\n") == 1


def test_pods_kept_for_the_audit_come_back_value_for_value() -> None:
    """Kept pods are packed as JSON: an integer orjson cannot write (past 64 bits) comes back an integer."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"n": 2**70 + 1, "f": 0.1, "s": "é\u2028"}}
    packed = Packed()
    for obj in (pod, pod | {"spec": {"n": 1}}):
        packed.add(cluster_source._pack(obj))
    assert [cluster_source._unpack(data) for data in packed] == [pod, pod | {"spec": {"n": 1}}]


def test_the_opt_in_label_is_the_webhooks_namespace_selector() -> None:
    webhook = yaml.safe_load((REPO / "deploy" / "base" / "mutatingwebhook.yaml").read_text())
    [selector] = {json.dumps(w["namespaceSelector"], sort_keys=True) for w in webhook["webhooks"]}
    expressions = {e["key"]: e for e in json.loads(selector)["matchExpressions"]}
    assert expressions[cluster_source.OPT_IN_LABEL] == {"key": cluster_source.OPT_IN_LABEL, "operator": "In", "values": ["true"]}
    assert set(expressions["kubernetes.io/metadata.name"]["values"]) == cluster_source.NEVER_REACHED


def test_running_pods_of_a_namespace_exactly_at_its_resource_quota_are_not_over_it(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Their GPUs are in the quota's status.used already (the server counts what exists)."""
    policies = tmp_path / "policies"
    write(policies / "quotas.yaml", "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: quotas}\n"
          "spec: {match: {kinds: [Pod]}, rules: {quota: {mode: enforce, resourceQuotas: true}}}\n")
    api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "full", "labels": {cluster_source.OPT_IN_LABEL: "true"}}})
    api.add({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": "full"},
             "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},
             "status": {"hard": {"requests.nvidia.com/gpu": "2"}, "used": {"requests.nvidia.com/gpu": "2"}}})
    for index in range(2):
        api.add({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"p{index}", "namespace": "full", "uid": f"0000000{index}-0000-0000-0000-000000000000"},
                 "spec": {"containers": [{"name": "c", "image": "ubuntu:22.04", "resources": {
                     "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]},
                 "status": {"phase": "Running"}})
    code, out, _ = audit(capsys, "-o", "json", "--cluster", "--kubeconfig", str(kubeconfig), policies=policies)
    results = [r for r in json.loads(out)["results"] if r["namespace"] == "full"]
    assert sorted(r["name"] for r in results) == ["p0", "p1"]
    assert code == 0 and all(r["verdict"] != "deny" for r in results), results
    # a third pod, as a manifest, would be over it
    gpu = {"name": "c", "image": "ubuntu:22.04", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    third = write(tmp_path / "p2.yaml", yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2", "namespace": "full"}, "spec": {"containers": [gpu]}}))
    code, out, _ = audit(capsys, "--cluster", "--kubeconfig", str(kubeconfig), str(third), policies=policies)
    assert code == 1 and "uses 2 of 2 requests.nvidia.com/gpu (ResourceQuota gpus)" in out, out


@pytest.mark.parametrize("output", ["text", "json", "policyreport", "junit", "sarif"])
def test_a_fleet_is_judged_page_by_page_and_reported_as_from_whole_results(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--cluster`` without manifests keeps of each result what the reports name, or (text, json) its
    rendered entry, compressed a block at a time (the pods listed once, kept packed until judged): every
    format says what it says from whole results, which ``--write-mutated`` keeps (it writes the mutated
    objects)."""
    monkeypatch.setattr(Packed, "BLOCK", 4)  # entries in several blocks, and some pending past the last one
    for namespace in ("gpu-team", "notebooks"):
        api.add({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": namespace, "labels": {cluster_source.OPT_IN_LABEL: "true"}}})  # fmt: skip
        api.add(_deployment("too-new", namespace))
        api.add(_deployment("fits", namespace, image="nvcr.io/nvidia/pytorch:24.01-py3"))
        for n, pod in enumerate(_items("pods.yaml")):
            pod["metadata"] = {"name": f"listed-{n}", "namespace": namespace, "uid": f"uid-{namespace}-{n}",
                               "labels": pod["metadata"].get("labels", {})}
            api.add(pod)
    common = ("-o", output, "--cluster", "-A", "--kubeconfig", str(kubeconfig), "--page-size", "3")
    before = len([r for r in api.requests(path_contains="/api/v1/pods") if not r.watch and "continue" not in r.query])
    code, paged, _ = audit(capsys, *common)
    pod_lists = [r for r in api.requests(path_contains="/api/v1/pods") if not r.watch and "continue" not in r.query]
    assert len(pod_lists) - before == 1  # for the view: the audited pods kept packed for the audit
    whole_code, whole, _ = audit(capsys, *common, "--write-mutated", str(tmp_path / "mutated"))
    stamp = re.compile(r'"seconds": ?\d+|timestamp="[^"]*"|time="[^"]*"')
    assert code == whole_code and stamp.sub("", paged) == stamp.sub("", whole)
    assert "too-new" in paged


@pytest.mark.parametrize("output", ["text", "json", "policyreport", "junit", "sarif"])
def test_a_fleet_with_nothing_to_audit_is_reported_as_from_whole_results(
    api: FakeApiServer, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str,
) -> None:
    """No namespace opted in: every format prints its empty report, as from whole results."""
    api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "quiet"}})
    api.add(_deployment("too-new", "quiet"))
    common = ("-o", output, "--cluster", "--kubeconfig", str(kubeconfig))
    code, kept, _ = audit(capsys, *common)
    whole_code, whole, _ = audit(capsys, *common, "--write-mutated", str(tmp_path / "mutated"))
    assert (code, kept) == (whole_code, whole) and "too-new" not in kept

"""Every output format, validated against its schema (or parsed back), on small cases and on the whole corpus."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.audit.support import CLUSTER, DATA, GPU_POD, SHARED_POD, TOO_NEW_POD, audit, write
from tests.support import MANIFESTS, POLICIES, REPO

REPORT_SCHEMA = REPO / "docs" / "audit-report.schema.json"


def _validator(path: Path) -> Any:
    schema = json.loads(path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _validate(path: Path, document: Any) -> None:
    errors = sorted(_validator(path).iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    """A denied, a warned and a mutated pod, and a broken document, in two files."""
    write(tmp_path / "pods.yaml", GPU_POD + "---\n" + TOO_NEW_POD + "---\nkind: [\n")
    write(tmp_path / "team b" / "shared.yaml", SHARED_POD.replace("ml-a", "ml-b"))
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], cases: Path, *args: str) -> tuple[int, str, str]:
    return audit(capsys, "--cluster-state", str(CLUSTER), *args, str(cases))


def test_json_follows_its_documented_schema(capsys: pytest.CaptureFixture[str], cases: Path) -> None:
    code, out, err = _run(capsys, cases, "-o", "json")
    report = json.loads(out)
    _validate(REPORT_SCHEMA, report)
    assert code == 1 and report["version"] == 1
    assert report["summary"] == {"objects": 3, "denied": 1, "warned": 1, "mutated": 1, "passed": 0, "errors": 1,
                                 "ignored": 0, "failOn": "deny", "exitCode": 1}
    by_name = {r["name"]: r for r in report["results"]}
    assert by_name["too-new"]["verdict"] == "deny" and not by_name["too-new"]["allowed"]
    assert (by_name["too-new"]["document"], by_name["too-new"]["line"]) == (2, 10)
    assert any(f["rule"] == "cudaDriver" and f["mode"] == "enforce" and f["phase"] == "validate"
               for f in by_name["too-new"]["findings"])
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in by_name["trainer"]["patch"]
    assert report["errors"][0]["document"] == 3 and "could not audit: " in err


def test_policyreport_per_namespace_as_kyverno_writes_them(capsys: pytest.CaptureFixture[str], cases: Path) -> None:
    _, out, _ = _run(capsys, cases, "-o", "policyreport")
    reports = yaml.safe_load(out)
    _validate(DATA / "policyreport-v1alpha2.schema.json", reports)
    by_scope = {(r["kind"], r["metadata"].get("namespace")): r for r in reports["items"]}
    assert set(by_scope) == {("PolicyReport", "ml-a"), ("PolicyReport", "ml-b"), ("ClusterPolicyReport", None)}
    ml_a = by_scope[("PolicyReport", "ml-a")]
    failed = [r for r in ml_a["results"] if r["result"] == "fail"]
    assert [(r["policy"], r["rule"], r["resources"][0]["name"], r["severity"]) for r in failed] == [
        ("gpu-validations", "cudaDriver", "too-new", "high")]
    assert ml_a["summary"]["fail"] == 1 and ml_a["summary"]["pass"] == len(ml_a["results"]) - 1
    mutated = [r for r in ml_a["results"] if r["resources"][0]["name"] == "trainer" and r["rule"] == "runtimeClass"]
    assert mutated[0]["result"] == "pass" and mutated[0]["message"].startswith("mutated: runtimeClassName")
    warned = [r for r in by_scope[("PolicyReport", "ml-b")]["results"] if r["result"] == "warn"]
    assert warned and all(r["rule"] == "resourceShape" for r in warned)
    [error] = by_scope[("ClusterPolicyReport", None)]["results"]
    assert error["result"] == "error" and error["properties"]["document"] == "3"


def test_junit_one_case_per_object_and_rule(capsys: pytest.CaptureFixture[str], cases: Path) -> None:
    _, out, _ = _run(capsys, cases, "-o", "junit")
    root = ET.fromstring(out.encode())
    cases_ = list(root.iter("testcase"))
    assert root.tag == "testsuites" and int(root.get("tests", "-1")) == len(cases_)
    keys = [(c.get("classname"), c.get("name")) for c in cases_ if c.get("name") != "document 3"]
    assert len(keys) == len(set(keys))  # one case per object and rule
    failures = [(c.get("classname"), c.get("name"), c.find("failure").get("type")) for c in cases_ if c.find("failure") is not None]  # type: ignore[union-attr]
    assert failures == [("Pod ml-a/too-new", "gpu-validations/cudaDriver", "deny")]
    warned = [c for c in cases_ if c.find("properties/property[@name='result'][@value='warn']") is not None]
    assert warned and all(c.find("failure") is None and "warn: " in (c.findtext("system-out") or "") for c in warned)
    [error] = [c for c in cases_ if c.find("error") is not None]
    assert error.get("name") == "document 3" and root.get("errors") == "1" and root.get("failures") == "1"


def test_junit_with_fail_on_warn_makes_warnings_failures_of_their_own_type(capsys: pytest.CaptureFixture[str], cases: Path) -> None:
    code, out, _ = _run(capsys, cases, "-o", "junit", "--fail-on", "warn")
    types = {f.get("type") for f in ET.fromstring(out.encode()).iter("failure")}
    assert code == 1 and types == {"deny", "warn"}


def test_sarif_is_valid_2_1_0_and_points_at_file_and_line(capsys: pytest.CaptureFixture[str], cases: Path) -> None:
    _, out, _ = _run(capsys, cases, "-o", "sarif")
    log = json.loads(out)
    _validate(DATA / "sarif-2.1.0-subset.schema.json", log)
    [run] = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids)) and "gpu-validations/cudaDriver" in ids
    denial = next(r for r in run["results"] if r["level"] == "error" and r["ruleId"] == "gpu-validations/cudaDriver")
    assert rules[denial["ruleIndex"]]["id"] == denial["ruleId"]
    for result in run["results"]:  # each message names its object once, at its start
        text = result["message"]["text"]
        if result["ruleId"] != "gpu-admission/invalid-manifest":
            subject = text.split(":", 1)[0].split(" container ", 1)[0].split(" spec.", 1)[0]
            assert text.count(subject) == 1, text
    physical = denial["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == (cases / "pods.yaml").as_uri() and physical["region"] == {"startLine": 10}
    warning = next(r for r in run["results"] if r["level"] == "warning")
    assert "team%20b/shared.yaml" in warning["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert any(r["ruleId"] == "gpu-admission/invalid-manifest" for r in run["results"])


@pytest.mark.parametrize("output", ["text", "json", "policyreport", "junit", "sarif"])
def test_the_whole_corpus_in_one_run_in_every_format(capsys: pytest.CaptureFixture[str], output: str) -> None:
    code, out, _ = audit(capsys, "-o", output, "--cluster-state", str(CLUSTER), str(MANIFESTS))
    assert code == 1  # the corpus has denials and unreadable files
    if output == "json":
        _validate(REPORT_SCHEMA, json.loads(out))
        assert json.loads(out)["summary"]["objects"] > 40
    elif output == "policyreport":
        _validate(DATA / "policyreport-v1alpha2.schema.json", yaml.safe_load(out))
    elif output == "sarif":
        _validate(DATA / "sarif-2.1.0-subset.schema.json", json.loads(out))
    elif output == "junit":
        assert int(ET.fromstring(out.encode()).get("tests", "0")) > 100


def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path: Path) -> None:
    path = write(tmp_path / "p.yaml", TOO_NEW_POD)
    command = [sys.executable, "-m", "webhook", "audit", "--policies", str(POLICIES), "--cluster-state", str(CLUSTER), str(path)]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    assert "\033[31mDENY\033[0m" in _on_a_terminal(command, env)
    assert "\033[" not in _on_a_terminal(command, {**env, "NO_COLOR": "1"})
    piped = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert piped.stdout.startswith("DENY    Pod ml-a/too-new")


def _on_a_terminal(command: list[str], env: dict[str, str]) -> str:
    primary, secondary = pty.openpty()
    try:
        subprocess.run(command, stdout=secondary, stderr=subprocess.DEVNULL, env=env, cwd=REPO, timeout=60)
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(primary)


def test_report_lines_hold_what_a_manifest_can_hold() -> None:
    """Values orjson refuses (an integer past 64 bits, bytes from !!binary) still make JSON; dates are RFC 3339."""
    import datetime

    from webhook.audit.report.run import dump_json

    value = {"results": [{"patch": [{"value": 2**70}]}, {"patch": [{"value": b"\x00"}]},
                         {"patch": [{"value": datetime.date(2001, 12, 14)}], "labels": {1: "int key"}}]}  # fmt: skip
    text = dump_json(value, expand=2)
    assert json.loads(text) == {"results": [{"patch": [{"value": 2**70}]}, {"patch": [{"value": "b'\\x00'"}]},
                                            {"patch": [{"value": "2001-12-14"}], "labels": {"1": "int key"}}]}  # fmt: skip
    assert len(text.splitlines()) == 7  # one line per result


def test_policyreport_skips_gpu_only_policies_per_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two pods of one namespace share which rules apply, not whether they ask for GPUs."""
    cpu_pod = GPU_POD.replace("name: trainer", "name: web").replace("{nvidia.com/gpu: 1}", "{cpu: 1}")
    path = write(tmp_path / "pods.yaml", GPU_POD + "---\n" + cpu_pod + "---\n" + GPU_POD.replace("trainer", "second"))
    _, out, _ = audit(capsys, "--cluster-state", str(CLUSTER), "-o", "policyreport", str(path))
    [ml_a] = [r for r in yaml.safe_load(out)["items"] if r["metadata"].get("namespace") == "ml-a"]
    by_pod: dict[str, set[str]] = {}
    for result in ml_a["results"]:
        by_pod.setdefault(result["resources"][0]["name"], set()).add(result["result"])
    assert by_pod["web"] >= {"skip"} and "skip" not in by_pod["trainer"] | by_pod["second"]
    skipped = {r["policy"] for r in ml_a["results"] if r["result"] == "skip"}
    assert "gpu-defaults" in skipped and "gpu-access-guard" not in skipped  # gpuOnly: false there


def test_policyreport_reports_class_scoped_policies_only_where_the_server_runs_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """inference-spread runs on inference pods, training-locality on training pods: each shows on its own."""
    # classified as the shipped classes do whatever the namespace: a PyTorchJob's worker, a KServe predictor
    training = GPU_POD.replace("{name: trainer,", "{name: trainer, labels: {training.kubeflow.org/job-name: bert},")
    inference = GPU_POD.replace("{name: trainer,", "{name: server, labels: {serving.kserve.io/inferenceservice: llm},")
    assert training != GPU_POD and inference != GPU_POD
    path = write(tmp_path / "pods.yaml", training + "---\n" + inference)
    _, out, _ = audit(capsys, "--cluster-state", str(CLUSTER), "-o", "policyreport", str(path))
    by_pod: dict[str, set[str]] = {}
    for report in yaml.safe_load(out)["items"]:
        for result in report["results"]:
            by_pod.setdefault(result["resources"][0]["name"], set()).add(result["policy"])
    assert "training-locality" in by_pod["trainer"] and "inference-spread" not in by_pod["trainer"], by_pod
    assert "inference-spread" in by_pod["server"] and "training-locality" not in by_pod["server"], by_pod


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainers, namespace: ml-a}
spec:
  selector: {matchLabels: {app: t}}
  template:
    metadata: {labels: {app: t}}
    spec:
      containers:
        - name: c
          image: pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime
          resources: {limits: {nvidia.com/gpu: 1}}
"""
CPU_NODE = "apiVersion: v1\nkind: Node\nmetadata: {name: cpu-1}\nstatus: {allocatable: {cpu: '8'}}\n"


def _cuda_results(out: str) -> list[dict[str, Any]]:
    return [r for report in yaml.safe_load(out)["items"] for r in report["results"]
            if r["policy"] == "gpu-validations" and r["rule"] == "cudaDriver"]


def test_notes_are_pass_or_skip_in_a_policyreport_not_fail(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a template whose pods will be steered: nothing wrong with it
    path = write(tmp_path / "deploy.yaml", DEPLOYMENT)
    _, out, _ = audit(capsys, "--cluster-state", str(CLUSTER), "-o", "policyreport", str(path))
    [steered] = _cuda_results(out)
    assert steered["result"] == "pass" and "its pods will be steered onto them" in steered["message"], steered
    # a cluster where no node could take the pod: nothing was checked
    nodes = write(tmp_path / "cluster" / "nodes.yaml", CPU_NODE)
    pod = write(tmp_path / "pod.yaml", GPU_POD)
    _, out, _ = audit(capsys, "--cluster-state", str(nodes.parent), "-o", "policyreport", str(pod))
    [unchecked] = _cuda_results(out)
    assert unchecked["result"] == "skip" and "no driver was checked" in unchecked["message"], unchecked
    _, out, _ = audit(capsys, "--cluster-state", str(nodes.parent), "-o", "json", str(pod))
    report = json.loads(out)
    _validate(REPORT_SCHEMA, report)
    [note] = [f for f in report["results"][0]["findings"] if f["rule"] == "cudaDriver"]
    assert note["mode"] == "note"
    # the text report's counts per rule name it a note too, not an audit-mode finding
    _, out, _ = audit(capsys, "--cluster-state", str(CLUSTER), str(tmp_path / "deploy.yaml"))
    [line] = [line for line in out.splitlines() if line.strip().startswith("gpu-validations/cudaDriver")]
    assert line.split()[1:] == ["note", "1"], line

"""``gpu-admission audit`` on DRA manifests: a pod and the template it names in one stream, and claims themselves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import MANIFESTS, POLICIES
from webhook import cli

MPS_DEMO = MANIFESTS / "NVIDIA__k8s-dra-driver__demo__specs__quickstart__gpu-test-mps.yaml"
ALL_GPUS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: every-gpu, namespace: ml}
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}
"""
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  containers: [{name: c, image: ubuntu:22.04, resources: {claims: [{name: gpu}]}}]
  resourceClaims: [{name: gpu, resourceClaimTemplateName: every-gpu}]
"""


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["audit", "--policies", str(POLICIES), *args])
    return code, capsys.readouterr().out


def test_nvidias_mps_demo_pod_is_a_gpu_pod_through_the_template_in_its_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not MPS_DEMO.is_file():
        pytest.skip(f"corpus not found: {MPS_DEMO}")
    code, out = audit(capsys, str(MPS_DEMO))
    assert code == 0
    # mutated (and warned: the example has no nodes to check CUDA against)
    assert re.search(r"^(MUTATE|WARN) +Pod gpu-test-mps/test-pod ", out, re.M), out
    assert "would set: securityContext, shm" in out
    assert "PASS    ResourceClaimTemplate gpu-test-mps/shared-gpu" in out


def test_reports_judge_the_mps_demo_pod_a_gpu_pod_as_the_engine_does(capsys: pytest.CaptureFixture[str]) -> None:
    """PolicyReport and JUnit: no "no GPU requested" skip for a pod whose GPUs come from a claim."""
    if not MPS_DEMO.is_file():
        pytest.skip(f"corpus not found: {MPS_DEMO}")
    _, out = audit(capsys, str(MPS_DEMO), "-o", "policyreport")
    results = [r for item in _policy_reports(out) for r in item.get("results") or []
               if any(res.get("name") == "test-pod" for res in r.get("resources") or [])]
    assert results, out
    assert not [r for r in results if r["result"] == "skip"], [r for r in results if r["result"] == "skip"]
    mutated = {r["rule"] for r in results if str(r.get("message", "")).startswith("mutated:")}
    assert {"securityContext", "shm"} <= mutated
    _, junit = audit(capsys, str(MPS_DEMO), "-o", "junit")
    assert "no GPU requested" not in junit


def _policy_reports(out: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]
    return [item for d in docs for item in (d.get("items") or [d])]


def test_a_template_of_every_gpu_is_denied_and_its_pod_recognised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "template.yaml").write_text(ALL_GPUS)
    (tmp_path / "pod.yaml").write_text(POD)
    code, out = audit(capsys, str(tmp_path))
    assert code == 1
    assert "DENY    ResourceClaimTemplate ml/every-gpu" in out
    assert "allocationMode All takes every gpu.nvidia.com device" in out
    assert "MUTATE  Pod ml/p" in out  # the template, found in another file, makes it a GPU pod


def test_templates_from_cluster_state_resolve_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state.yaml").write_text(ALL_GPUS)
    (tmp_path / "pod.yaml").write_text(POD)
    code, out = audit(capsys, "--cluster-state", str(tmp_path / "state.yaml"), str(tmp_path / "pod.yaml"))
    assert code == 0 and "MUTATE  Pod ml/p" in out


def test_a_missing_template_warns_only_when_the_cluster_state_lists_templates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pod.yaml").write_text(POD.replace("every-gpu", "elsewhere"))
    _, out = audit(capsys, str(tmp_path / "pod.yaml"))
    assert "does not exist" not in out and "no resourceclaimtemplates in the cluster snapshot" in out
    (tmp_path / "state.yaml").write_text(ALL_GPUS)
    _, out = audit(capsys, "--cluster-state", str(tmp_path / "state.yaml"), str(tmp_path / "pod.yaml"))
    assert "claim 'gpu': ResourceClaimTemplate ml/elsewhere does not exist; the pod would stay Pending" in out


def test_a_claim_template_is_reported_on_its_draclaims_rules_only(capsys: pytest.CaptureFixture[str]) -> None:
    if not MPS_DEMO.is_file():
        pytest.skip(f"corpus not found: {MPS_DEMO}")
    _, out = audit(capsys, str(MPS_DEMO), "-o", "policyreport")
    results = [r for item in _policy_reports(out) for r in item.get("results") or []
               if any(res.get("kind") == "ResourceClaimTemplate" for res in r.get("resources") or [])]
    assert results and {r["rule"] for r in results} == {"draClaims"}
    assert {r["result"] for r in results} == {"pass"}

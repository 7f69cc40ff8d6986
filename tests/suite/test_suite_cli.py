"""gpu-admission test: the shipped suite passes; a wrong expectation fails with a readable reason; a
broken test file exits 2 naming file, document and field; --update writes today's results."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.support import POLICIES, REPO, assert_crashed, break_the_engine
from webhook import cli

SUITE = POLICIES / ".tests"
VALIDATIONS = SUITE / "validations"
MUTATIONS = SUITE / "mutations"


def _test(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["test", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _write_test(folder: Path, results: list[dict[str, object]], *, resources: Path = VALIDATIONS / "workloads.yaml",
                extra: str = "") -> Path:  # fmt: skip
    """A test of the shipped policies on the suite's cluster, expecting ``results``."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUAdmissionTest", "metadata": {"name": "t"},
        "spec": {"policies": [str(POLICIES)], "resources": [str(resources)], "clusterState": [str(SUITE / "cluster")],
                 "results": results},
    }  # fmt: skip
    path = folder / "gpu-admission-test.yaml"
    path.write_text(extra + yaml.safe_dump(document, sort_keys=False))
    return path


def test_the_shipped_suite_passes_through_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "webhook", "test", str(SUITE)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    passed = int(summary.split()[2])
    assert summary == f"Test Summary: {passed} tests passed and 0 tests failed" and passed >= 80, summary
    # every rule family and every mode is expected somewhere in the suite
    expected = [r for path in SUITE.rglob("gpu-admission-test.yaml") for d in yaml.safe_load_all(path.read_text())
                for r in d["spec"]["results"]]  # fmt: skip
    rules = {r["rule"] for r in expected if "rule" in r}
    assert rules == {"tolerations", "nodeAffinity", "runtimeClass", "priorityClass", "securityContext", "shm",
                     "gpuVisibility", "spreadReplicas", "trainingLocality", "notebookLifetime", "resourceShape",
                     "draClaims", "quota", "cudaDriver", "gpuAccess"}  # fmt: skip
    assert {r["verdict"] for r in expected if "rule" in r} == {"deny", "audit", "warn", "mutate", "pass", "skip", "none"}


def test_a_wrong_verdict_fails_with_what_was_wanted_and_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_test(tmp_path, [
        {"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validations", "rule": "resourceShape", "verdict": "pass"},
        {"resources": ["Deployment/ml-c/well-formed"], "verdict": "pass"},
    ])  # fmt: skip
    code, out, err = _test(capsys, str(tmp_path))
    assert code == 1 and err == ""
    rows = [line for line in out.splitlines() if line.startswith("│ 1 ") or line.startswith("│ 2 ")]
    assert "gpu-validations" in rows[0] and "Deployment ml-a/half-gpu" in rows[0]
    assert "│ Fail   │ want pass, got deny" in rows[0] and "│ Pass   │ ok: pass" in rows[1], out
    assert "  #1 Deployment ml-a/half-gpu [gpu-validations/resourceShape]: want pass, got deny\n" in out
    assert out.endswith("Test Summary: 1 test passed and 1 test failed\n")


def test_a_misspelt_policy_or_rule_is_a_broken_test_not_a_none_that_passes(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # control: "none" for a rule the policy leaves out is a real expectation, and holds
    _write_test(tmp_path / "ok", [{"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-defaults",
                                   "rule": "quota", "verdict": "none"}])
    assert _test(capsys, str(tmp_path / "ok"))[0] == 0
    path = _write_test(tmp_path / "typo", [
        {"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validation", "rule": "resourceShape", "verdict": "none"},
        {"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validations", "rule": "resourceShap", "verdict": "none"},
    ])  # fmt: skip
    code, out, err = _test(capsys, str(tmp_path / "typo"))
    assert code == 2 and "0 tests passed" in out, out
    assert f"{path}: document 1 (GPUAdmissionTest t): spec.results[0].policy: gpu-validation: no such policy in " \
           "spec.policies (" in err, err
    assert "spec.results[1].rule: resourceShap: no such rule (tolerations, " in err, err


def test_a_wrong_message_fails_listing_the_messages_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_test(tmp_path, [{"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validations",
                            "rule": "resourceShape", "verdict": "deny", "message": r"0\.25"}])  # fmt: skip
    code, out, _ = _test(capsys, str(tmp_path))
    assert code == 1
    assert "  #1 Deployment ml-a/half-gpu [gpu-validations/resourceShape]: no message matches /0\\.25/\n" in out
    assert "      message: Deployment ml-a/half-gpu spec.template container \"serve\" (resources.limits): nvidia.com/gpu is 0.5, a fraction" in out


def test_one_wrong_field_of_a_patched_resource_fails_with_a_semantic_diff(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    expected = yaml.safe_load((MUTATIONS / "patched" / "pod-ml-a-trainer.yaml").read_text())
    expected["spec"]["securityContext"]["runAsUser"] = 1001
    # key order and layout do not matter: the file is written back reordered and in flow style
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(expected, sort_keys=True, default_flow_style=True))
    _write_test(tmp_path, [{"resources": ["Pod/ml-a/trainer"], "verdict": "mutate", "patchedResource": "trainer.yaml"}],
                resources=MUTATIONS / "pods.yaml")  # fmt: skip
    code, out, _ = _test(capsys, str(tmp_path))
    assert code == 1
    assert ("  #1 Pod ml-a/trainer: patched resource differs from trainer.yaml\n"
            "      spec.securityContext.runAsUser: expected 1001, got 1000\n") in out, out
    # put right, it passes: only that field differed
    expected["spec"]["securityContext"]["runAsUser"] = 1000
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(expected, sort_keys=True))
    assert _test(capsys, str(tmp_path))[0] == 0


def test_a_broken_test_file_exits_2_naming_file_document_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write_test(tmp_path / "good", [{"resources": ["Deployment/ml-c/well-formed"], "verdict": "pass"}])
    broken = tmp_path / "broken" / "gpu-admission-test.yaml"
    broken.parent.mkdir()
    text = good.read_text()
    broken.write_text(text + "---\n" + text.replace("results:", "resultz:").replace("verdict: pass", "verdict: denied"))
    code, out, err = _test(capsys, str(tmp_path))
    assert code == 2
    assert f"broken test: {broken}: document 2 (GPUAdmissionTest t): spec.resultz: Extra inputs are not permitted" in err, err
    assert "Test Summary: 1 test passed and 0 tests failed" in out  # the other files still ran
    # a resource no object answers to: the expectation's field is named
    _write_test(tmp_path / "good", [{"resources": ["Pod/nowhere"], "verdict": "pass"}])
    code, _, err = _test(capsys, str(tmp_path / "good"))
    assert code == 2 and "document 1 (GPUAdmissionTest t): spec.results[0].resources[0]: Pod/nowhere: no such object among the resources" in err, err
    # a rule's verdict on the object as a whole
    _write_test(tmp_path / "good", [{"resources": ["Deployment/ml-c/well-formed"], "verdict": "audit"}])
    code, _, err = _test(capsys, str(tmp_path / "good"))
    assert code == 2 and "spec.results[0]: Value error, an object's verdict is one of deny, warn, mutate, pass" in err, err


def test_3_on_an_unexpected_error_in_one_line_and_the_traceback_with_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    break_the_engine(monkeypatch)
    _write_test(tmp_path, [{"resources": ["Deployment/ml-c/well-formed"], "verdict": "pass"}])
    assert_crashed(lambda *args: _test(capsys, *args, str(tmp_path)))


def test_update_writes_todays_results_keeping_comments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_test(tmp_path, [
        {"resources": ["Deployment/ml-a/half-gpu"], "policy": "gpu-validations", "rule": "resourceShape",
         "verdict": "pass", "message": "no such words"},
    ], resources=MUTATIONS / "pods.yaml", extra="# why this test exists\n")  # fmt: skip
    shutil.copy(VALIDATIONS / "workloads.yaml", tmp_path / "more.yaml")
    spec = yaml.safe_load(path.read_text())
    spec["spec"]["resources"].append("more.yaml")
    path.write_text("# why this test exists\n" + yaml.safe_dump(spec, sort_keys=False))
    assert _test(capsys, str(tmp_path))[0] == 1
    code, out, _ = _test(capsys, "--update", str(tmp_path))
    assert code == 0 and out.startswith(f"updated {path} and ")
    text = path.read_text()
    assert text.startswith("# why this test exists\n")
    written = yaml.safe_load(text)["spec"]["results"]
    assert written[0]["verdict"] == "deny" and "0\\.5, a fraction" in written[0]["message"]
    trainer = next(r for r in written if r["resources"] == ["Pod/ml-a/trainer"] and "rule" not in r)
    assert trainer == {"resources": ["Pod/ml-a/trainer"], "verdict": "mutate",
                       "patchedResource": "patched/pod-ml-a-trainer.yaml"}  # fmt: skip
    assert yaml.safe_load((tmp_path / trainer["patchedResource"]).read_text()) == yaml.safe_load(
        (MUTATIONS / "patched" / "pod-ml-a-trainer.yaml").read_text())
    assert {"resources": ["Pod/ml-c/notebook-for-two-days"], "verdict": "deny"} in written
    code, out, _ = _test(capsys, str(tmp_path))
    assert code == 0 and "0 tests failed" in out


def test_junit_carries_each_check_and_what_a_failure_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_test(tmp_path, [
        {"resources": ["Deployment/ml-a/half-gpu"], "verdict": "pass"},
        {"resources": ["Deployment/ml-c/well-formed"], "verdict": "pass"},
    ])  # fmt: skip
    code, out, _ = _test(capsys, "-o", "junit", str(tmp_path))
    assert code == 1
    root = ET.fromstring(out)
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
    cases = root.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["#1 Deployment ml-a/half-gpu", "#2 Deployment ml-c/well-formed"]
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == "want pass, got deny"
    assert cases[1].find("failure") is None

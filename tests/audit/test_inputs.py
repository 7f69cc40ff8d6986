"""Every input form: folders, multi-document streams with broken documents, Helm output, Lists, JSON, stdin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.audit.support import CLUSTER, GPU_POD, SHARED_POD, TOO_NEW_POD, audit, audit_process, write
from webhook.audit import inputs

HELM = """\
---
# Source: trainer/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: trainer
---
# Source: trainer/templates/empty.yaml
# (this template rendered to nothing)
---
# Source: trainer/templates/pod.yaml
""" + GPU_POD + """\
---
# Source: trainer/templates/broken.yaml
apiVersion: v1
kind: Pod
metadata:
  name: {{ .Values.name }}
"""


def _parse(text: str, name: str = "f.yaml") -> list[inputs.Document | inputs.Problem]:
    return list(inputs.parse(inputs.SourceFile(name, name), text))


def test_a_broken_document_in_the_middle_is_reported_and_the_others_audited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = GPU_POD + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n---\n" + SHARED_POD
    code, out, _ = audit(capsys, "--cluster-state", str(CLUSTER), str(write(tmp_path / "s.yaml", stream)))
    assert code == 1  # an unreadable document fails the run
    assert "MUTATE  Pod ml-a/trainer" in out and "WARN    Pod ml-a/shared" in out
    assert f"ERROR   {tmp_path / 's.yaml'}: document 2, line 10: invalid YAML at line " in out
    assert "(" + str(tmp_path / "s.yaml") + ", document 3, line 15)" in out


def test_helm_template_output_with_comments_empty_documents_and_leftovers() -> None:
    parsed = _parse(HELM)
    docs = [p for p in parsed if isinstance(p, inputs.Document)]
    problems = [p for p in parsed if isinstance(p, inputs.Problem)]
    assert [(d.obj["kind"], d.index, d.line) for d in docs] == [("ServiceAccount", 1, 3), ("Pod", 2, 12)]
    # the comment-only document is no document; the template left-over is one, and broken
    [problem] = problems
    assert (problem.index, problem.line) == (3, 22) and problem.message.startswith("invalid YAML")


def test_a_list_is_flattened_with_the_position_of_each_item(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    items = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "ml-a"},
              "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}} for i in range(3)]
    path = write(tmp_path / "list.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    code, out, _ = audit(capsys, "-o", "json", str(path))
    report = json.loads(out)
    assert code == 0
    assert [(r["name"], r["item"], r["document"]) for r in report["results"]] == [("p0", 0, 1), ("p1", 1, 1), ("p2", 2, 1)]


def test_an_api_list_response_gives_its_items_their_kind() -> None:
    [doc] = _parse(json.dumps({"apiVersion": "v1", "kind": "PodList", "items": [{"metadata": {"name": "a"}}]}), "l.json")
    assert isinstance(doc, inputs.Document) and doc.obj["kind"] == "Pod" and doc.obj["apiVersion"] == "v1"


def test_what_is_not_a_kubernetes_object_is_a_problem() -> None:
    parsed = _parse("replicaCount: 1\n---\n- a\n---\nhello\n")
    assert [(p.index, p.message) for p in parsed if isinstance(p, inputs.Problem)] == [
        (1, "not a Kubernetes object (no apiVersion and kind)"),
        (2, "not a Kubernetes object (no apiVersion and kind)"),
        (3, "not a Kubernetes object (no apiVersion and kind)"),
    ]


def test_broken_json_is_reported_with_a_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "pod.json", '{"apiVersion": "v1",\n "kind": "Pod",\n "metadata": {"name": }}\n')
    code, out, _ = audit(capsys, str(path))
    assert code == 1 and f"{path}: document 1, line 1: invalid JSON at line 3: Expecting value" in out


def test_folders_are_read_recursively_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "b" / "deep" / "too-new.yaml", TOO_NEW_POD)
    write(tmp_path / "a.yml", GPU_POD)
    write(tmp_path / "notes.txt", "not a manifest")
    write(tmp_path / ".github" / "workflows" / "ci.yaml", "on: push\njobs: {}\n")
    code, out, _ = audit(capsys, "-o", "json", str(tmp_path))
    sources = [Path(r["source"]).relative_to(tmp_path).as_posix() for r in json.loads(out)["results"]]
    assert code == 0 and sources == ["a.yml", "b/deep/too-new.yaml"]


def test_stdin_in_a_real_process() -> None:
    done = audit_process("-o", "json", "--cluster-state", str(CLUSTER), "-", stdin=GPU_POD + "---\n" + SHARED_POD)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert [(r["source"], r["name"], r["verdict"]) for r in results] == [
        ("<stdin>", "trainer", "mutate"), ("<stdin>", "shared", "warn")]


def test_namespace_fills_in_objects_that_name_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "p.yaml", GPU_POD.replace(", namespace: ml-a", "") + "---\n" + SHARED_POD)
    _, out, _ = audit(capsys, "-o", "json", "--namespace", "team-x", str(path))
    assert [r["namespace"] for r in json.loads(out)["results"]] == ["team-x", "ml-a"]


def test_a_folder_without_manifests_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "README.md", "no manifests here")
    code, _, err = audit(capsys, str(tmp_path))
    assert code == 2 and err == f"error: {tmp_path}: no manifest files (*.yaml, *.yml, *.json) in it\n"


def test_a_file_that_is_not_utf8_is_a_problem_and_the_others_are_audited(tmp_path: Path) -> None:
    """One Latin-1 file in a folder of manifests: reported with file and line, the rest audited, exit 1
    (it stopped the run with exit 2 and no report)."""
    write(tmp_path / "m" / "a.yaml", GPU_POD)
    (tmp_path / "m" / "latin.yaml").write_bytes(b"apiVersion: v1\nkind: Pod\nmetadata: {name: caf\xe9}\n")
    done = audit_process(str(tmp_path / "m"), "-o", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["objects"] == 1 and report["summary"]["errors"] == 1, report["summary"]
    assert "latin.yaml: document 1, line 3: not UTF-8 text: byte 0xe9 at line 3" in done.stdout + done.stderr


def test_a_utf16_file_with_its_byte_order_mark_is_read_as_kubectl_reads_it(tmp_path: Path) -> None:
    """What Windows PowerShell's `kubectl get -o yaml > f.yaml` writes."""
    (tmp_path / "utf16.yaml").write_bytes(GPU_POD.encode("utf-16"))  # (with its BOM)
    done = audit_process(str(tmp_path / "utf16.yaml"), "-o", "json")
    report = json.loads(done.stdout)
    assert report["summary"]["objects"] == 1 and report["summary"]["errors"] == 0, (report["summary"], done.stderr)


@pytest.mark.parametrize("newline", ["\r", "\x85", "\r\n"], ids=["cr", "nel", "crlf"])
def test_each_line_break_yaml_reads_splits_documents_as_lf_does(newline: str) -> None:
    """A broken document among good ones, written with CR alone (classic Mac OS) or NEL: read as the
    LF file is (each document its own, numbered and placed alike), not as one broken document."""
    stream = GPU_POD + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n---\n" + SHARED_POD
    expected = _parse(stream)
    assert [type(d).__name__ for d in expected] == ["Document", "Problem", "Document"]
    got = _parse(stream.replace("\n", newline))
    assert [(type(d).__name__, d.index, d.line) for d in got] == [(type(d).__name__, d.index, d.line) for d in expected]
    assert [d.obj for d in got if isinstance(d, inputs.Document)] == [d.obj for d in expected if isinstance(d, inputs.Document)]
    assert [d.message for d in got if isinstance(d, inputs.Problem)] == [d.message for d in expected if isinstance(d, inputs.Problem)]

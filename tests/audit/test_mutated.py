"""--diff and --write-mutated: what the mutating webhook would make of the manifests."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.audit.support import CLUSTER, GPU_POD, SHARED_POD, audit, write
from tests.support import assert_schema_valid
from webhook.audit.progress import Progress

SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: svc}\nspec: {ports: [{port: 80}]}\n"


def test_diff_shows_each_changed_object_and_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "p.yaml", GPU_POD + "---\n" + SERVICE)
    code, out, _ = audit(capsys, "--diff", "--cluster-state", str(CLUSTER), str(path))
    assert code == 0
    assert out.startswith(f"--- {path} document 1: Pod ml-a/trainer\n+++ {path} document 1: Pod ml-a/trainer (mutated)\n")
    assert "+  runtimeClassName: nvidia\n" in out and "+  - key: nvidia.com/gpu\n" in out
    assert "svc" not in out and out.count("\n--- ") == 0


def test_diff_with_a_report_format_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "p.yaml", GPU_POD)
    code, out, err = audit(capsys, "--diff", "-o", "sarif", "--cluster-state", str(CLUSTER), str(path))
    assert code == 2 and out == "" and "--diff prints a diff instead of a report" in err, err


def test_write_mutated_mirrors_the_inputs_and_a_second_pass_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in"
    write(source / "apps" / "pods.yaml", GPU_POD + "---\n" + SERVICE + "---\nkind: [\n")
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(SHARED_POD), yaml.safe_load(SERVICE)]}
    write(source / "list.json", json.dumps(listed))
    out_dir = tmp_path / "out"
    audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(source))
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    assert written == ["apps/pods.yaml", "list.json"]
    pods_text = (out_dir / "apps" / "pods.yaml").read_text()
    assert pods_text.startswith("# gpu-admission: ") and "document 3" in pods_text and "(left out)" in pods_text
    pod, service = yaml.safe_load_all(pods_text)
    assert pod["spec"]["runtimeClassName"] == "nvidia" and service == yaml.safe_load(SERVICE)
    assert_schema_valid(pod)
    rebuilt = json.loads((out_dir / "list.json").read_text())
    assert rebuilt["kind"] == "List" and [i["kind"] for i in rebuilt["items"]] == ["Pod", "Service"]
    assert rebuilt["items"][0]["spec"]["runtimeClassName"] == "nvidia"
    # the mutated manifests, audited again: nothing left to patch
    _, out, _ = audit(capsys, "-o", "json", "--cluster-state", str(CLUSTER), str(out_dir))
    assert [r["patch"] for r in json.loads(out)["results"]] == [[], []]


def test_write_mutated_keeps_inputs_of_the_same_name_apart_and_json_as_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for team in ("team-a", "team-b"):
        write(tmp_path / team / "pod.json", json.dumps(yaml.safe_load(GPU_POD)))
        write(tmp_path / team / "pod.yaml", GPU_POD)
    write(tmp_path / "loose" / "team-a" / "pod.yaml", GPU_POD)
    out_dir = tmp_path / "out"
    audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(tmp_path / "team-a"),
          str(tmp_path / "team-b"), str(tmp_path / "loose" / "team-a" / "pod.yaml"))
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    assert written == ["team-a/pod-2.yaml", "team-a/pod.json", "team-a/pod.yaml", "team-b/pod.json", "team-b/pod.yaml"]
    for name in written:
        text = (out_dir / name).read_text()
        (obj,) = [json.loads(text)] if name.endswith(".json") else list(yaml.safe_load_all(text))
        assert obj["spec"]["runtimeClassName"] == "nvidia", name
    _, out, _ = audit(capsys, "-o", "json", "--cluster-state", str(CLUSTER), str(out_dir))
    assert [r["patch"] for r in json.loads(out)["results"]] == [[]] * 5


def test_a_json_list_with_an_item_left_out_is_written_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A List item that is no Kubernetes object is left out: in a JSON file, which holds no comment, the
    run's report says it (a YAML comment before the JSON made the file invalid JSON)."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(GPU_POD), {"kind": "x"}]}
    write(tmp_path / "in" / "partial.json", json.dumps(listed))
    out_dir = tmp_path / "out"
    code, out, _ = audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(tmp_path / "in"))
    assert code == 1 and "items[1] is not a Kubernetes object" in out, out
    written = json.loads((out_dir / "partial.json").read_text())
    assert [i["spec"]["runtimeClassName"] for i in written["items"]] == ["nvidia"]
    _, out, _ = audit(capsys, "-o", "json", "--cluster-state", str(CLUSTER), str(out_dir))
    report = json.loads(out)
    assert report["summary"]["errors"] == 0 and [r["patch"] for r in report["results"]] == [[]]
    # a JSON file none of whose documents could be read holds nothing to write: no file, not comments
    write(tmp_path / "in" / "broken.json", '{"kind": ')
    out_dir = tmp_path / "out-2"
    code, out, _ = audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(tmp_path / "in"))
    assert code == 1 and "broken.json: document 1" in out, out
    assert sorted(p.name for p in out_dir.iterdir()) == ["partial.json"]


def test_write_mutated_refuses_to_overwrite_the_manifests_it_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in"
    write(source / "pod.yaml", GPU_POD)
    write(source / "values.yaml", "replicaCount: 2\nimage: {tag: v1}\n")  # not a Kubernetes object
    before = {p.name: p.read_text() for p in source.iterdir()}
    code, _, err = audit(capsys, "--write-mutated", str(source), "--cluster-state", str(CLUSTER), str(source))
    assert code == 2 and "is a manifest read" in err and "nothing was written" in err, err
    assert {p.name: p.read_text() for p in source.iterdir()} == before
    code, _, _ = audit(capsys, "--write-mutated", str(source / "out"), "--cluster-state", str(CLUSTER), str(source))
    assert code != 2 and (source / "out" / "pod.yaml").is_file()  # (values.yaml: a problem, exit 1)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_appears_only_after_a_second_and_clears_its_line() -> None:
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, 4, enabled=True, clock=clock)
    progress.file_done()
    assert stream.getvalue() == ""  # a short run draws nothing
    clock.now += 1.5
    progress.file_done()
    assert stream.getvalue() == "\r[" + "=" * 15 + ">" + " " * 14 + "] 2/4 files, 0 objects"
    progress.close()
    assert stream.getvalue().endswith("\r" + " " * 70 + "\r")


def test_progress_draws_nothing_when_disabled() -> None:
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, 1, enabled=False, clock=clock)
    clock.now += 5
    progress.file_done()
    progress.close()
    assert stream.getvalue() == ""


def test_written_manifests_spell_every_value_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Several GPU containers get the same securityContext and /dev/shm mount: written out in full in
    each, as kubectl writes a manifest, not as YAML anchors and aliases (&id001 / *id001)."""
    pod = yaml.safe_load(GPU_POD)
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**first, "name": f"worker-{i}"} for i in range(3)]
    source = write(tmp_path / "in" / "pod.yaml", yaml.safe_dump(pod))
    out_dir = tmp_path / "out"
    audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(source))
    text = (out_dir / "pod.yaml").read_text()
    assert "&id" not in text and "*id" not in text, text
    written = yaml.safe_load(text.split("\n", 1)[1] if text.startswith("#") else text)
    containers = written["spec"]["containers"]
    assert [c["securityContext"] for c in containers] == [containers[0]["securityContext"]] * 3
    assert all({"name": "gpu-admission-shm", "mountPath": "/dev/shm"} in c["volumeMounts"] for c in containers)
    code, out, _ = audit(capsys, "--diff", "--cluster-state", str(CLUSTER), str(source))
    assert code == 0 and "&id" not in out and "*id" not in out


def test_a_document_inside_itself_is_written_with_an_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """YAML can build an object that holds itself (an alias to its own anchor): written out in
    full it would have no end, so it keeps its alias, and the documents beside it are written."""
    looped = "apiVersion: v1\nkind: ConfigMap\nmetadata: &m {name: loop, namespace: ml-a, labels: {self: *m}}\ndata: {}\n"
    source = write(tmp_path / "in" / "pods.yaml", GPU_POD + "---\n" + looped)
    out_dir = tmp_path / "out"
    code, _, err = audit(capsys, "--write-mutated", str(out_dir), "--cluster-state", str(CLUSTER), str(source))
    assert code == 0, err
    pod, config_map = yaml.safe_load_all((out_dir / "pods.yaml").read_text())
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert config_map["metadata"]["labels"]["self"]["name"] == "loop"


def test_diff_of_a_denied_object_says_why_the_run_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a Deployment whose template asks for half a GPU: nothing to diff (templates are not mutated), exit 1
    half = yaml.safe_load(GPU_POD)
    deployment: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "half", "namespace": "ml-a"},
                  "spec": {"selector": {"matchLabels": {"app": "half"}},
                           "template": {"metadata": {"labels": {"app": "half"}}, "spec": half["spec"]}}}
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0.5"
    path = write(tmp_path / "d.yaml", yaml.safe_dump(deployment) + "---\n" + GPU_POD)
    code, out, err = audit(capsys, "--diff", "--cluster-state", str(CLUSTER), str(path))
    assert code == 1
    assert "Pod ml-a/trainer (mutated)" in out and "half" not in out
    lines = err.splitlines()
    assert lines and all(line.startswith(f"denied: Deployment ml-a/half ({path}, document 1, line 1): [gpu-validations/resourceShape]")
                         for line in lines), err
    assert "0.5" in err
    # warnings fail the run with --fail-on warn: they are what is printed then
    shared = write(tmp_path / "s.yaml", SHARED_POD)
    code, _, err = audit(capsys, "--diff", "--fail-on", "warn", "--cluster-state", str(CLUSTER), str(shared))
    assert code == 1 and err.startswith("warned: Pod ml-a/shared") and "gpumem" in err, err

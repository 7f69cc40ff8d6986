"""``gpu-admission audit`` end to end: manifests + cluster-state files → report and exit code."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support import MANIFESTS, POLICIES, REPO, TAG_MISFITS
from webhook import cli

CLUSTER = REPO / "examples" / "cluster"
CUDA_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml-a}
spec:
  nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
  containers:
    - name: c
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
      resources: {limits: {nvidia.com/gpu: 4}}
"""


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["audit", "--policies", str(POLICIES), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_whole_corpus_with_the_example_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = audit(capsys, "--cluster-state", str(CLUSTER / "nodes.yaml"), str(MANIFESTS))
    assert code == 1
    assert "DENY    Job gpu-inference/vllm-inference-check" in out
    assert "CUDA 12.8 (vLLM 0.10.2) needs driver >= 570.26; the newest driver on the 4 node(s)" in out
    assert re.match(r"\d+ objects: \d+ denied, \d+ warned, \d+ mutated, \d+ passed; 4 document", out.splitlines()[-1])
    # the two corpus files that are not YAML and the two that are no Kubernetes object are reported,
    # each with file, document and line; the rest is audited
    assert out.count("ERROR   ") == 4 and "torchserve__gpu.yaml: document 1, line 1: invalid YAML at line 8" in out
    assert "jupyterhub-values.yaml: document 1, line 1: not a Kubernetes object" in out
    assert err == ""


def test_a_kubectl_list_of_nodes_decides_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, _ = audit(capsys, "--cluster-state", str(CLUSTER / "nodes.yaml"), str(tmp_path / "pod.yaml"))
    assert code == 1
    assert "CUDA 12.4 (pytorch/pytorch tag) needs driver >= 550.54.14; the newest driver on the 2 node(s) it could land on is 535.104.05" in out


def test_an_api_node_list_without_item_kinds_works_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = yaml.safe_load((CLUSTER / "nodes.yaml").read_text())
    api = {"apiVersion": "v1", "kind": "NodeList", "items": [{k: v for k, v in n.items() if k != "kind"} for n in listed["items"]]}
    (tmp_path / "nodes.json").write_text(json.dumps(api))
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, _ = audit(capsys, "--cluster-state", str(tmp_path / "nodes.json"), str(tmp_path / "pod.yaml"))
    assert code == 1 and "needs driver >= 550.54.14" in out


def test_without_cluster_state_cuda_is_not_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, _ = audit(capsys, str(tmp_path / "pod.yaml"))
    assert code == 0
    assert "warn    [gpu-validations/cudaDriver] Pod ml-a/trainer: cluster state unavailable: no nodes" in out


def quota_policies(tmp_path: Path, limits: str = "[{scope: team, teamLabel: team, max: 8}]") -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    shipped = (target / "gpu-validations.yaml").read_text()
    enabled = shipped.replace('mode: "off"', "mode: enforce").replace(
        "limits: []", f"limits: {limits}"
    )
    assert enabled != shipped
    (target / "gpu-validations.yaml").write_text(enabled)
    return target


def test_quota_against_example_pods_namespaces_and_quotas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pod.yaml").write_text(CUDA_POD.replace("nvidia.com/gpu: 4", "nvidia.com/gpu: 2"))
    state = [f"--cluster-state={CLUSTER / name}" for name in ("nodes.yaml", "namespaces.yaml", "pods.yaml", "quotas.yaml")]
    code = cli.main(["audit", "--policies", str(quota_policies(tmp_path)), *state, str(tmp_path / "pod.yaml")])
    out = capsys.readouterr().out
    assert code == 1
    # (the pod being deleted holds its 4 GPUs: ResourceQuota counts it until its grace period has passed,
    # and a snapshot has no clock to see it pass)
    assert "team a (team=a) uses 11 of 8 nvidia.com/gpu; this pod asks for 2" in out
    assert "namespace ml-a uses 6 of 8 requests.nvidia.com/gpu (ResourceQuota gpu-quota); this pod asks for 2" not in out
    # 6 + 2 fits the native quota exactly; 3 would not
    (tmp_path / "pod.yaml").write_text(CUDA_POD.replace("nvidia.com/gpu: 4", "nvidia.com/gpu: 3"))
    cli.main(["audit", "--policies", str(quota_policies(tmp_path / "again")), *state, str(tmp_path / "pod.yaml")])
    assert "uses 6 of 8 requests.nvidia.com/gpu (ResourceQuota gpu-quota); this pod asks for 3" in capsys.readouterr().out


def test_complete_marks_an_empty_listing_as_known(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    (tmp_path / "empty.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n")
    policies = str(quota_policies(tmp_path, "[{max: 8}]"))
    cli.main(["audit", "--policies", policies, "--cluster-state", str(tmp_path / "empty.yaml"), str(tmp_path / "pod.yaml")])
    out = capsys.readouterr().out
    assert "no pods in the cluster snapshot (--complete pods if the cluster has none) (GPU quota not checked)" in out
    assert "no resourcequotas in the cluster snapshot (--complete resourcequotas if the cluster has none)" in out
    cli.main(["audit", "--policies", policies, "--cluster-state", str(tmp_path / "empty.yaml"),
              "--complete", "pods", "--complete", "resourcequotas", str(tmp_path / "pod.yaml")])
    out = capsys.readouterr().out
    assert "not checked)" in out and "quota not checked" not in out and "ResourceQuota not checked" not in out


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, _ = audit(capsys, "--format", "json", "--cluster-state", str(CLUSTER / "nodes.yaml"), str(tmp_path / "pod.yaml"))
    [result] = json.loads(out)["results"]
    assert code == 1 and result["allowed"] is False and result["verdict"] == "deny"
    assert {(f["rule"], f["mode"]) for f in result["findings"]} >= {("cudaDriver", "enforce")}


def test_a_broken_cluster_state_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text("items: [unclosed\n")
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, _, err = audit(capsys, "--cluster-state", str(tmp_path / "nodes.yaml"), str(tmp_path / "pod.yaml"))
    assert code == 2 and err.startswith("error: cluster state ") and "invalid YAML" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("value, error", TAG_MISFITS)
def test_a_value_its_tag_does_not_fit_in_a_cluster_state_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, error: str
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(f"apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {{name: n, generation: {value}}}\n")
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, err = audit(capsys, "--cluster-state", str(nodes), str(tmp_path / "pod.yaml"))
    assert (code, out) == (2, "")
    assert err == f"error: cluster state {nodes}: invalid YAML: a value that its tag does not fit ({error})\n"


@pytest.mark.parametrize("obj, error", [
    ({"kind": "Node", "metadata": "n1"}, "a Node without a name: not a valid Node (AttributeError: "),
    ({"kind": "Pod", "metadata": {"name": "p", "namespace": "ml-a"}, "spec": {"containers": "c"}},
     "Pod p: not a valid Pod (AttributeError: "),
])  # fmt: skip
def test_an_object_of_the_wrong_shape_in_a_cluster_state_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], obj: dict[str, object], error: str
) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [obj]}))
    (tmp_path / "pod.yaml").write_text(CUDA_POD)
    code, out, err = audit(capsys, "--cluster-state", str(state), str(tmp_path / "pod.yaml"))
    assert (code, out) == (2, "") and err.startswith(f"error: cluster state {state}: {error}") and err.count("\n") == 1


@pytest.mark.parametrize("files", [{}, {"README.md": "policies go here\n"}, {"exception.yaml": ""}], ids=["empty", "no-yaml", "empty-yaml"])
def test_policies_without_a_gpu_policy_are_refused_as_the_server_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    """A wrong --policies path (or an empty ConfigMap) would pass every manifest: exit 2, as `serve`
    and `policies check` refuse it; the control, the shipped policies, refuses the pod."""
    (tmp_path / "pod.yaml").write_text(CUDA_POD.replace("nvidia.com/gpu: 4", 'nvidia.com/gpu: "0.5"'))
    folder = tmp_path / "policies"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    code = cli.main(["audit", "--policies", str(folder), str(tmp_path / "pod.yaml")])
    out, err = capsys.readouterr()
    assert code == 2 and "no GPUPolicy found" in err and "PASS" not in out, (out, err)
    code, out, _ = audit(capsys, str(tmp_path / "pod.yaml"))
    assert code == 1 and "DENY" in out

"""Every corpus manifest gets a decision from mutate then validate, as kube-apiserver would ask.

Documents that are not valid YAML are skipped (the corpus has real files that
do not parse); every other document is evaluated, with the example cluster
state and with no cluster state at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support import MANIFESTS, REPO, apply_patch, assert_schema_valid, shipped_policies
from tests.test_corpus import schema_valid
from webhook.audit import inputs, snapshot
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.protocol import ClusterView
from webhook.view.snapshot import EMPTY_VIEW

CLUSTER = REPO / "examples" / "cluster"
#: corpus files that SOURCES.md marks INVALID YAML
INVALID = {
    "kserve__kserve__docs__samples__custom__torchserve__gpu.yaml",
    "kubeflow__mpi-operator__examples__v2beta1__deepspeed__deepspeed-helloworld.yaml",
}


def corpus_files() -> list[Path]:
    files = sorted(p for p in MANIFESTS.iterdir() if p.is_file())
    assert len(files) >= 60, f"expected the manifest corpus at {MANIFESTS}"
    return files


def example_view() -> ClusterView:
    return snapshot.load(sorted(CLUSTER.glob("*.yaml")))


def objects_of(path: Path) -> tuple[list[Mapping[str, Any]], list[str]]:
    parsed = list(inputs.parse(inputs.SourceFile(path.name, path.name), path.read_text(encoding="utf-8")))
    problems = [p.text() for p in parsed if isinstance(p, inputs.Problem) and "invalid YAML" in p.message]
    return [d.obj for d in parsed if isinstance(d, inputs.Document)], problems


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.name[:90])
def test_every_corpus_manifest_gets_a_decision(path: Path) -> None:
    objects, problems = objects_of(path)
    assert bool(problems) == (path.name in INVALID), problems
    policies = shipped_policies()
    for view in (example_view(), EMPTY_VIEW):
        for obj in objects:
            _mutate_then_validate(policies, obj, view)


def test_broken_documents_are_skipped_and_the_others_kept() -> None:
    text = "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\n  metadata: [\n---\nkind: Pod\nmetadata: {name: c}\n"
    text = text.replace("kind: Pod\n", "apiVersion: v1\nkind: Pod\n")
    parsed = list(inputs.parse(inputs.SourceFile("f.yaml", "f.yaml"), text))
    assert [d.obj["metadata"]["name"] for d in parsed if isinstance(d, inputs.Document)] == ["a", "c"]
    problems = [p.text() for p in parsed if isinstance(p, inputs.Problem)]
    assert len(problems) == 1 and problems[0].startswith("f.yaml: document 2, line 5: invalid YAML"), problems


def _mutate_then_validate(policies: Any, obj: Mapping[str, Any], view: ClusterView) -> None:
    request = Request.for_object(obj)
    if (request.group, request.kind) not in policies.kinds:
        return
    mutation = engine.evaluate(policies, request, view, "mutate")
    patched = apply_patch(obj, mutation.patch)
    assert patched == (mutation.patched if mutation.patch else obj)
    if schema_valid(obj):  # a few corpus files are invalid as published
        assert_schema_valid(patched)
    again = engine.evaluate(policies, Request.for_object(patched), view, "mutate")
    assert again.patch == (), f"second mutation pass patched again: {again.patch}"
    validation = engine.evaluate(policies, Request.for_object(patched), view, "validate")
    assert validation.patch == ()
    assert validation.allowed == (not validation.denials)
    for finding in validation.findings:
        assert finding.message.startswith(request.kind), finding.message




def _findings(name: str, view: ClusterView) -> list[str]:
    policies = shipped_policies()
    objects, _ = objects_of(MANIFESTS / name)
    texts = []
    for obj in objects:
        request = Request.for_object(obj)
        if (request.group, request.kind) in policies.kinds:
            mutated = engine.evaluate(policies, request, view, "mutate").patched or obj
            texts += [f"{f.rule}:{f.mode}: {f.message}" for f in
                      engine.evaluate(policies, Request.for_object(mutated), view, "validate").findings]
    return texts


def test_unsubstituted_placeholders_in_a_pytorchjob_are_refused() -> None:
    found = _findings("aws-samples__awsome-distributed-training__3.test_cases__pytorch__FSDP__kubernetes__llama3_1_8b-fsdp.yaml", EMPTY_VIEW)
    assert any("resourceShape:enforce" in f and "'$GPU_PER_NODE' is not a valid quantity" in f for f in found), found


def test_hami_sharing_resources_are_warned_about() -> None:
    found = _findings("Project-HAMi__HAMi__examples__nvidia__use_memory_fraction.yaml", EMPTY_VIEW)
    assert any("resourceShape:warn" in f and "nvidia.com/gpumem-percentage" in f for f in found), found


def test_init_only_gpus_of_the_gpu_operator_validator_are_warned_about() -> None:
    found = _findings("NVIDIA__gpu-operator__assets__state-device-plugin-validation__cuda-vector-add.yaml", EMPTY_VIEW)
    assert any("resourceShape:warn" in f and "only init containers request GPUs" in f for f in found), found


def test_ngc_24_12_runs_on_the_example_a100s_through_forward_compatibility() -> None:
    # R535 on a data-center GPU runs NGC 24.12 (cuda-compat); R550 is not among the branches sourced for 24.x
    found = _findings("Azure__AKS__examples__kueue-and-ray-on-aks__3-workloads__gpu-lab__manifests__20-multinode-training.yaml", example_view())
    assert not any("cudaDriver:enforce" in f for f in found), found
    assert any("CUDA 12.6.3 (NGC 24.12) needs driver >= 560.35.05; only 2 of 3 node(s)" in f for f in found), found


def test_vllm_0_10_is_too_new_for_the_example_drivers() -> None:
    found = _findings("Azure__AKS__examples__end-to-end-AI-codelabs__kueue-gpu-inference-autoscaling__manifests__inference-job.yaml", example_view())
    assert any("cudaDriver:enforce" in f and "CUDA 12.8 (vLLM 0.10.2) needs driver >= 570.26" in f for f in found), found


def test_without_cluster_state_cuda_fails_open() -> None:
    found = _findings("Azure__AKS__examples__kueue-and-ray-on-aks__3-workloads__gpu-lab__manifests__20-multinode-training.yaml", EMPTY_VIEW)
    assert found and all(f.startswith("cudaDriver:warn: ") and "cluster state unavailable" in f for f in found), found


#: issue #42: the corpus objects gpuAccess refuses, and how often (docs/validations.md, "System namespaces and the audit")
GPU_ACCESS = {
    # runtimeClassName nvidia and NVIDIA_VISIBLE_DEVICES=all on a GPU-less pod: whole-node GPUs outside the scheduler
    "Xe__x__kube__alrest__ollama__deployment.yaml": 3,  # + NVIDIA_DRIVER_CAPABILITIES
    "Xe__x__kube__alrest__faster-whisper__deployment.yaml": 1,
    # privileged GPU containers (an NCCL test over InfiniBand; a fine-tuning Job): a GPUPolicyException's to allow
    "kubeflow__mpi-operator__examples__v2beta1__nccl-tests__nccl-tests.yaml": 1,
    "GoogleCloudPlatform__kubernetes-engine-samples__ai-ml__mix-train-and-inference__workloads__fine-tune-l4-dws.yaml": 1,
}


def test_gpu_access_refuses_the_corpus_pods_that_reach_gpus_without_asking() -> None:
    found = {path.name: n for path in corpus_files() if path.name not in INVALID
             if (n := sum(f.startswith("gpuAccess:enforce") for f in _findings(path.name, EMPTY_VIEW)))}
    assert found == GPU_ACCESS
    # NVIDIA's own DaemonSets (device plugin, DCGM exporter: privileged, hostPaths of the kubelet and
    # /run/nvidia) request no GPU and mount no device path: nothing for gpuAccess, wherever they run
    assert "NVIDIA__k8s-device-plugin__deployments__static__nvidia-device-plugin.yml" not in found
    assert "NVIDIA__gpu-operator__assets__state-dcgm-exporter__0800_daemonset.yaml" not in found

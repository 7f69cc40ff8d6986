"""Image → CUDA inference, with the NGC and TensorFlow tables checked against FACTS.md §4."""

from __future__ import annotations

import re

import pytest

from tests.facts import section, table_rows
from webhook.gpu import image_table, images
from webhook.gpu.cuda import CudaVersion


def _months(first: str, last: str) -> list[str]:
    """"23.12", "24.02" → ["23.12", "24.01", "24.02"]."""
    y, m = (int(p) for p in first.split("."))
    end = tuple(int(p) for p in last.split("."))
    out = []
    while (y, m) <= end:
        out.append(f"{y:02d}.{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def facts_ngc() -> list[tuple[str, str, str]]:
    ranges = []
    for cells in table_rows(section(4)):
        for rel, cuda in zip(cells[0::2], cells[1::2]):
            if rel:
                first, _, last = rel.partition("–")
                ranges.append((first, last or first, cuda))
    return ranges


def facts_tensorflow() -> list[tuple[str, str, str]]:
    line = next(l for l in section(4).split("\n- ") if l.startswith("`tensorflow/tensorflow"))
    return [(a, b or a, c) for a, b, c in re.findall(r"(\d+\.\d+)(?:–(\d+\.\d+))?→(\d+\.\d+)", line)]


NGC = facts_ngc()
NGC_RELEASES = [(rel, cuda) for first, last, cuda in NGC for rel in _months(first, last)]


def test_facts_tables_were_read() -> None:
    assert len(NGC) == 29 and ("23.12", "24.02", "12.3.2") in NGC
    assert len(facts_tensorflow()) == 5


def test_ngc_table_is_the_facts_table() -> None:
    assert sorted(image_table.NGC_RELEASES) == sorted(NGC)


@pytest.mark.parametrize(("release", "cuda"), NGC_RELEASES, ids=[r for r, _ in NGC_RELEASES])
def test_ngc_release_row_by_row(release: str, cuda: str) -> None:
    assert images.ngc_cuda(release) == CudaVersion.parse(cuda)
    inferred = images.from_image(f"nvcr.io/nvidia/pytorch:{release}-py3")
    assert inferred is not None and inferred.version == CudaVersion.parse(cuda)


@pytest.mark.parametrize("release", ["21.12", "26.01", "22.13"])
def test_ngc_releases_outside_the_table_are_unknown(release: str) -> None:
    assert images.ngc_cuda(release) is None
    assert images.from_image(f"nvcr.io/nvidia/tritonserver:{release}-py3") is None


def test_tensorflow_table_is_the_facts_table() -> None:
    assert sorted(image_table.TENSORFLOW_RELEASES) == sorted(facts_tensorflow())
    for first, last, cuda in facts_tensorflow():
        for minor in range(int(first.split(".")[1]), int(last.split(".")[1]) + 1):
            inferred = images.from_image(f"tensorflow/tensorflow:2.{minor}.0-gpu")
            assert inferred is not None and inferred.version == CudaVersion.parse(cuda)


@pytest.mark.parametrize(
    ("image", "cuda"),
    [
        ("nvidia/cuda:12.4.1-base-ubuntu22.04", "12.4.1"),
        ("nvidia/cuda:12.0-base", "12.0"),
        ("docker.io/nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04", "11.8.0"),
        ("nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04", "12.2.0"),
        ("mirror.example.com:5000/nvidia/cuda:13.0.1-runtime-ubuntu24.04", "13.0.1"),
        ("pytorch/pytorch:2.1.0-cuda12.1-cudnn8-runtime", "12.1"),
        ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", "12.4"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "12.4.1"),
        ("nvcr.io/nvidia/tritonserver:24.01-py3", "12.3.2"),
        ("nvcr.io/nvidia/nemo:25.04.01", "12.9.0"),
        ("tensorflow/tensorflow:2.15.0-gpu-jupyter", "12.2"),
        ("nvidia/cuda", None),  # no tag
        ("nvidia/cuda@sha256:0123abcd", None),
        ("pytorch/pytorch:latest", None),
        ("tensorflow/tensorflow:latest-gpu", None),
        ("tensorflow/tensorflow:1.4.1-gpu-py3", "8.0"),
        ("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04", None),
        ("nvcr.io/nvidia/gpu-operator:v24.3.0", None),
        ("registry.example.com/llm/server:v0.6.3", None),
        ("", None),
        # CUDA spelled in the tag
        ("nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.7.1-ubuntu18.04", "11.7.1"),
        ("registry.baidubce.com/paddlepaddle/paddle:2.4.0rc0-gpu-cuda11.2-cudnn8.1-trt8.0", "11.2"),
        ("example.com/app:v1-cuda-12.2", "12.2"),
        ("example.com/app:build_cuda12.4_py3", "12.4"),
        ("rayproject/ray-ml:2.46.0.0e19ea-py311-cu121", "12.1"),
        ("example.com/torch:2.1-cu118", "11.8"),
        ("example.com/app:cuda", None),
        ("example.com/app:accuracy-1", None),
        # the release table (image_table.RELEASES)
        ("ghcr.io/huggingface/text-generation-inference:2.0.4", "12.1.0"),
        ("ghcr.io/huggingface/text-generation-inference:1.1.1", "11.8.0"),
        ("ghcr.io/huggingface/text-generation-inference:3.3.7", "12.4.0"),
        ("ghcr.io/huggingface/text-generation-inference:2.0.4-rocm", None),
        ("vllm/vllm-openai:v0.10.2", "12.8"),
        ("vllm/vllm-openai:v0.8.5", "12.4"),
        ("vllm/vllm-openai:v0.6.6.post1", "12.4"),
        ("vllm/vllm-openai:v0.20.0", "13.0"),
        ("vllm/vllm-openai:v0.11.0", None),  # no source for 0.11-0.19
        ("vllm/vllm-openai:v0.28.0", "13.0"),
        ("vllm/vllm-openai:v0.29.0", None),
        ("vllm/vllm-openai:latest", None),  # moves with every release
        ("rayproject/ray-ml:2.46.0.0e19ea-py311-gpu", "12.1.1"),
        ("rayproject/ray-ml:2.47.1-gpu", "12.1.1"),
        ("rayproject/ray-ml:2.46.0-py310", "12.1.1"),  # ray-ml without a platform is -gpu
        ("rayproject/ray-ml:2.46.0-py311-cu128", "12.8"),  # the tag says it
        ("rayproject/ray-ml:2.46.0-py311-cpu", None),
        ("rayproject/ray-ml:2.0.0-gpu", "11.2.0"),
        ("rayproject/ray-ml:1.9.2-py38", "11.2.0"),
        ("rayproject/ray-ml:1.8.0-gpu", None),  # branched before -gpu meant cu112
        ("rayproject/ray-ml:2.1.0-gpu", None),
        ("rayproject/ray-ml:2.48.0-gpu", None),
        ("rayproject/ray-ml:latest-gpu", None),
        ("oguzpastirmaci/gpu-burn:latest", "11.1.1"),
        ("oguzpastirmaci/gpu-burn", "11.1.1"),
        ("oguzpastirmaci/gpu-burn:cuda9", None),
        ("tensorflow/tensorflow:1.15.5-gpu-py3", "10.0"),
        ("tensorflow/tensorflow:2.4.1-gpu", "11.0"),
        ("nvcr.io/nvidia/cloud-native/gpu-operator-validator:v1.10.1", "11.6.0"),
        ("k8s.gcr.io/cuda-vector-add:v0.1", "8.0"),
        ("4pdosc/ai-benchmark:2.4.1-gpu", "11.0"),
        ("quay.io/rh-aiservices-bu/vllm-openai-ubi9:0.4.2", "12.1.1"),
    ],
)
def test_cuda_from_image_tags(image: str, cuda: str | None) -> None:
    inferred = images.from_image(image)
    assert (str(inferred.version) if inferred else None) == cuda


def test_annotations_then_policy_map_then_tag() -> None:
    image = "nvcr.io/nvidia/pytorch:24.05-py3"
    rules = [("nvcr.io/nvidia/pytorch:*", "12.2")]
    both = {images.ANNOTATION: "12.3", f"{images.ANNOTATION}.trainer": "12.1.1"}
    found = images.infer("trainer", image, both, rules)
    assert isinstance(found, images.Inferred) and str(found.version) == "12.1.1"
    found = images.infer("other", image, both, rules)
    assert isinstance(found, images.Inferred) and str(found.version) == "12.3" and "annotation" in found.source
    found = images.infer("other", image, {}, rules)
    assert isinstance(found, images.Inferred) and str(found.version) == "12.2" and "policy" in found.source
    found = images.infer("other", image, {}, [])
    assert isinstance(found, images.Inferred) and str(found.version) == "12.4.1"


@pytest.mark.parametrize("image", ["ubuntu", "ubuntu:22.04", "busybox:1.28", "docker.io/library/python:3.12-slim",
                                   "alpine:3.20", "gcr.io/distroless/static:nonroot", "registry.access.redhat.com/ubi9/ubi",
                                   "docker.io/rocm/rocm-terminal:6.4"])
def test_images_without_cuda_are_no_cuda_not_unknown(image: str) -> None:
    found = images.infer("c", image, {})
    assert isinstance(found, images.Inferred) and found.version is None and "carries no CUDA" in found.source


def test_a_policy_says_an_image_has_no_cuda() -> None:
    found = images.infer("c", "registry.example/tools/kubectl:1", {}, [("registry.example/tools/*", "none")])
    assert isinstance(found, images.Inferred) and found.version is None


@pytest.mark.parametrize("image", ["${IMAGE_URI}", "FILLED BY THE OPERATOR", "gcr.io/<your_project>/x:latest",
                                   "{username}/torchserve-gpu:latest", "Registry.Example/App:1 "])
def test_placeholders_are_not_image_references(image: str) -> None:
    assert images.infer("c", image, {}) == "its image is not a valid image reference (a template placeholder?)"


def test_table_rows_carry_documented_forward_compatibility() -> None:
    ngc = images.from_image("nvcr.io/nvidia/pytorch:25.01-py3")
    assert ngc is not None and [b.major for b in ngc.branches] == [470, 525, 535, 550]
    ubi = images.from_image("quay.io/rh-aiservices-bu/vllm-openai-ubi9:0.4.2")
    assert ubi is not None and [b.major for b in ubi.branches] == [470, 525]
    assert all(row.source for row in image_table.RELEASES)


@pytest.mark.parametrize(
    ("image", "cuda", "source", "cited"),
    [
        ("vllm/vllm-openai:v0.28.0", "13.0", "vLLM 0.28.0", "ARG CUDA_VERSION=13.0.3"),
        ("rayproject/ray-ml:2.46.0.0e19ea-py311-gpu", "12.1.1", "Ray ML 2.46.0", "issue #54102"),
        ("rayproject/ray-ml:2.0.0-gpu", "11.2.0", "Ray ML 2.0.0", "ML_CUDA_VERSION = cu112"),
        ("oguzpastirmaci/gpu-burn:latest", "11.1.1", "gpu-burn (oguzpastirmaci), image table",
         "FROM nvidia/cuda:11.1.1-runtime"),
    ],
)
def test_table_rows_say_where_the_cuda_came_from(image: str, cuda: str, source: str, cited: str) -> None:
    found = images.infer("c", image, {})
    assert isinstance(found, images.Inferred) and str(found.version) == cuda and found.source == source
    ref = images.ImageRef.parse(image)
    covering = [row for row in image_table.RELEASES if ref.name in row.repositories and _covers(row, ref.tag)]
    assert len(covering) == 1 and cited in covering[0].source and covering[0].cuda == cuda


def _covers(row: image_table.Release, tag: str) -> bool:
    match = re.fullmatch(row.tag, tag)
    if match is None or not row.first:
        return match is not None

    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    return numbers(row.first) <= numbers(match[1]) <= numbers(row.last)


def test_ray_ml_carries_the_forward_compatibility_of_its_cuda_base() -> None:
    # built FROM nvidia/cuda:12.1.1-cudnn8-devel: its NVIDIA_REQUIRE_CUDA lists the 470 and 525 branches
    ray = images.from_image("rayproject/ray-ml:2.47.1-py311-gpu")
    assert ray is not None and [b.major for b in ray.branches] == [470, 525]


def test_unknown_cuda_says_why() -> None:
    assert images.infer("c", "registry.example.com/llm/server:v0.6.3", {}) == "no CUDA version known for its image"
    bad = images.infer("c", "x", {images.ANNOTATION: "twelve"})
    assert isinstance(bad, str) and "'twelve' is not a CUDA version" in bad


@pytest.mark.parametrize(
    ("image", "registry", "repository", "tag"),
    [
        ("busybox", "docker.io", "library/busybox", ""),
        ("nvidia/cuda:12.4.1-base", "docker.io", "nvidia/cuda", "12.4.1-base"),
        ("localhost:5000/team/app:1.0", "localhost:5000", "team/app", "1.0"),
        ("nvcr.io/nvidia/pytorch:24.05-py3@sha256:abc", "nvcr.io", "nvidia/pytorch", "24.05-py3"),
        ("index.docker.io/pytorch/pytorch", "docker.io", "pytorch/pytorch", ""),
    ],
)
def test_image_references(image: str, registry: str, repository: str, tag: str) -> None:
    assert images.ImageRef.parse(image) == images.ImageRef(registry, repository, tag)

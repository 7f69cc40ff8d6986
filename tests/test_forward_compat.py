"""CUDA forward compatibility by default: a table of (image, driver, GPU product) cases.

Each case runs the shipped ``gpu-validations`` policy (strict table, forward
compatibility ``auto``) on a one-node cluster: the image's CUDA is newer than
the driver's own, so only forward compatibility can run it. Sources:

- [NGC-25] NGC release notes 25.10 and 26.05, "Driver Requirements": on a data
  center GPU, "NVIDIA driver release 470.57 (or later R470), 525.85 (or later
  R525), 535.86 (or later R535), or 550.54 (or later R550) in
  forward-compatibility mode"; "users should upgrade from all R418, R440,
  R450, R460, R510, R520, R530, R545 and R555 and R560 drivers, which are not
  forward-compatible".
- [NGC-LTS] issue #17 (NGC PyTorch 24.01 on R535) and the long-term branches
  R470/R535 every NGC statement lists while they are supported.
- [FC] NVIDIA CUDA Compatibility guide, "Forward Compatibility": "applicable
  only for systems with NVIDIA Data Center GPUs" (select NGC Server Ready RTX
  SKUs, Jetson); otherwise CUDA error 804.
- [REQ] nvidia/cuda 12.4.1 images (gitlab.com/nvidia/container-images/cuda
  dist/12.4.1): ``NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471
  … brand=tesla,driver>=525,driver<526 … brand=tesla,driver>=535,driver<536 …``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support import POLICIES, shipped_policies
from webhook.gpu import forward_compat, images
from webhook.gpu.cuda import CudaVersion, DriverVersion
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

H100, A100, L40S, T4, A10G = (
    "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "Tesla-T4", "NVIDIA-A10G",
)

#: (image, node driver, GPU product, runs?, source)
CASES: list[tuple[str, str, str, bool, str]] = [
    # forward compatibility runs it: data-center GPU, supported branch
    ("nvcr.io/nvidia/pytorch:24.01-py3", "535.104.05", H100, True, "NGC-LTS"),
    ("nvcr.io/nvidia/pytorch:24.12-py3", "535.161.08", A100, True, "NGC-LTS"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", f"{A100}-MIG-1g.10gb", True, "NGC-LTS, FACTS §2 MIG suffix"),
    ("nvcr.io/nvidia/tritonserver:24.08-py3", "470.82.01", T4, True, "NGC-LTS"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", "550.54.15", H100, True, "NGC-25"),
    ("nvcr.io/nvidia/tritonserver:25.10-py3", "535.86.10", L40S, True, "NGC-25"),
    ("nvcr.io/nvidia/nemo:25.04", "525.85.12", A10G, True, "NGC-25"),
    ("nvcr.io/nvidia/pytorch:25.10-py3", "470.82.01", T4, True, "NGC-25"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "535.104.05", A100, True, "REQ"),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "525.147.05", A10G, True, "REQ"),
    # true denials: consumer or workstation GPU, unsupported branch, below the branch minimum, no cuda-compat
    ("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", "NVIDIA-GeForce-RTX-4090", False, "FC"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", "NVIDIA-RTX-A6000", False, "FC"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", "Quadro-RTX-8000", False, "FC"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", "545.23.08", H100, False, "NGC-25: R545 not forward-compatible"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", "560.35.03", H100, False, "NGC-25: R560 not forward-compatible"),
    ("nvcr.io/nvidia/pytorch:25.10-py3", "450.80.02", A100, False, "NGC-25: R450 not forward-compatible"),
    ("nvcr.io/nvidia/pytorch:25.01-py3", "535.54.03", A100, False, "NGC-25: R535 from 535.86"),
    ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "535.104.05", A100, False, "no cuda-compat known"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "545.23.08", H100, False, "REQ: no brand=tesla R545 alternative"),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "535.104.05", "NVIDIA-GeForce-RTX-4090", False,
     "REQ lists brand=geforce R535 too, but FC: cuda-compat needs a data-center GPU"),
]


def _evaluate(image: str, driver: str, product: str, policies: Any = None) -> Any:
    node = {
        "kind": "Node",
        "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": product,
                                               "nvidia.com/cuda.driver-version.full": driver}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": image, "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    view = SnapshotView.from_objects([node])
    return engine.evaluate(policies or shipped_policies(), Request.for_object(pod), view, "validate")


@pytest.mark.parametrize(("image", "driver", "product", "runs", "source"), CASES,
                         ids=[f"{i.rsplit('/', 1)[-1]}@{d}/{p}" for i, d, p, _, _ in CASES])
def test_forward_compatibility_table(image: str, driver: str, product: str, runs: bool, source: str) -> None:
    found = images.from_image(image)
    needed = found.version if found else None
    assert needed is not None and needed > CudaVersion(0, 0)
    decision = _evaluate(image, driver, product)
    assert decision.allowed is runs, (source, decision.message())
    if not runs:
        assert f"the newest driver on the 1 node(s) it could land on is {driver}" in decision.message()


def test_a_denial_names_the_branches_forward_compatibility_would_run_it_on() -> None:
    decision = _evaluate("nvcr.io/nvidia/pytorch:25.01-py3", "535.104.05", "NVIDIA-GeForce-RTX-4090")
    assert "forward compatibility would run it on data-center GPUs with R470/R525/R535/R550" in decision.message()


def test_an_unknown_or_missing_product_is_not_assumed_to_be_a_data_center_gpu() -> None:
    assert not _evaluate("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", "").allowed
    assert not _evaluate("nvcr.io/nvidia/pytorch:24.05-py3", "535.104.05", "NVIDIA-Mystery-9000").allowed


def test_nvidia_require_cuda_names_the_branches_of_its_cuda_compat() -> None:
    text = ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 "
            "brand=tesla,driver>=525,driver<526 brand=nvidia,driver>=525,driver<526 brand=tesla,driver>=535,driver<536")
    requirement = forward_compat.parse_requirement(text)
    assert requirement.cuda == CudaVersion(12, 4)
    assert [b.major for b in requirement.branches] == [470, 525, 535]
    r535 = requirement.branches[2]
    assert r535.admits(DriverVersion.parse("535.54.03")) and not r535.admits(DriverVersion.parse("550.54.15"))  # type: ignore[arg-type]
    assert forward_compat.parse_requirement("cuda>=11.0").branches == ()
    assert forward_compat.parse_requirement("brand=tesla,driver>=418").branches == ()  # not one branch


def test_an_image_config_with_tesla_branches_runs_on_them() -> None:
    env = {"CUDA_VERSION": "12.4.1",
           "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"}
    found = images.infer("c", "registry.example/team/app:1", {}, config=images.ImageConfig("sha256:" + "a" * 64, env))
    assert isinstance(found, images.Inferred) and found.version == CudaVersion(12, 4, 1)
    assert found.source == "image config at sha256:aaaaaaaaaaaa"
    assert [b.major for b in found.branches] == [470, 535]
    assert images.ImageConfig("sha256:b", {"PATH": "/usr/bin"}).inferred() is None


def test_forward_compatibility_can_be_turned_off() -> None:
    text = (POLICIES / "gpu-validations.yaml").read_text().replace("mode: auto ", 'mode: "off"', 1)
    shared = [(POLICIES / name).read_text() for name in ("workload-kinds.yaml", "workload-classes.yaml")]
    policies = loader.load_text("\n---\n".join([*shared, text]), "off")
    assert _evaluate("nvcr.io/nvidia/pytorch:24.01-py3", "535.104.05", H100).allowed
    assert not _evaluate("nvcr.io/nvidia/pytorch:24.01-py3", "535.104.05", H100, policies=policies).allowed


def test_what_an_image_needs_follows_the_resolver_answer_and_the_pods_own_annotation() -> None:
    """One policy set remembers each image's needs; a new resolver answer or a pod's annotation still counts."""
    policies = shipped_policies()
    image = "registry.example/team/app:1"
    node = {"kind": "Node", "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
                                                                  "nvidia.com/cuda.driver-version.full": "535.104.05"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}

    def validate(configs: dict[str, images.ImageConfig], annotations: dict[str, str] | None = None) -> Any:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}},
               "spec": {"containers": [{"name": "c", "image": image, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        view = dataclasses.replace(SnapshotView.from_objects([node]), image_configs=configs)
        return engine.evaluate(policies, Request.for_object(pod), view, "validate")

    unknown = validate({})
    assert unknown.allowed and any("no CUDA version known for its image" in w for w in unknown.warnings)
    too_new = images.ImageConfig("sha256:" + "c" * 64, {"CUDA_VERSION": "12.8.0"})
    assert "CUDA 12.8.0 (image config at sha256:cccccccccccc)" in validate({image: too_new}).message()
    assert unknown.warnings == validate({}).warnings  # the remembered answer went with its config
    assert validate({image: too_new}, {images.ANNOTATION: "12.2"}).allowed  # the pod's own statement wins
    assert not validate({image: too_new}).allowed

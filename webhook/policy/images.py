"""Which CUDA version a container image carries, from what admission can see.

Sources, most specific first: a per-container pod annotation, a pod
annotation, the policy's image → CUDA map, then the tag conventions of
FACTS.md §4 (``nvidia/cuda``, ``pytorch/pytorch``, NGC framework releases,
``tensorflow/tensorflow:*-gpu``). No registry lookup: that would put network
I/O on the admission path. tests/test_images.py checks the NGC and
TensorFlow tables row by row against FACTS.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from webhook.policy.cuda import CudaVersion

#: pod annotation stating the CUDA version of every GPU container;
#: ``<ANNOTATION>.<container name>`` states one container's.
ANNOTATION = "gpu-admission.io/cuda-version"

_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}

#: NGC framework repositories whose YY.MM tags follow the release table below.
NGC_FRAMEWORKS = frozenset(
    {"pytorch", "tensorflow", "tritonserver", "nemo", "jax", "paddlepaddle", "mxnet", "tensorrt", "cuda-dl-base", "dgl"}
)

#: NGC release ranges (first, last, CUDA), FACTS.md §4 (NGC/Triton release notes).
NGC_RELEASES: tuple[tuple[str, str, str], ...] = (
    ("22.01", "22.02", "11.6.0"),
    ("22.03", "22.03", "11.6.1"),
    ("22.04", "22.04", "11.6.2"),
    ("22.05", "22.05", "11.7.0"),
    ("22.06", "22.08", "11.7.1"),
    ("22.09", "22.12", "11.8.0"),
    ("23.01", "23.02", "12.0.1"),
    ("23.03", "23.04", "12.1.0"),
    ("23.05", "23.07", "12.1.1"),
    ("23.08", "23.09", "12.2.1"),
    ("23.10", "23.10", "12.2.2"),
    ("23.11", "23.11", "12.3.0"),
    ("23.12", "24.02", "12.3.2"),
    ("24.03", "24.03", "12.4.0"),
    ("24.04", "24.05", "12.4.1"),
    ("24.06", "24.06", "12.5.0"),
    ("24.07", "24.07", "12.5.1"),
    ("24.08", "24.08", "12.6.0"),
    ("24.09", "24.09", "12.6.1"),
    ("24.10", "24.10", "12.6.2"),
    ("24.11", "24.12", "12.6.3"),
    ("25.01", "25.02", "12.8.0"),
    ("25.03", "25.03", "12.8.1"),
    ("25.04", "25.05", "12.9.0"),
    ("25.06", "25.07", "12.9.1"),
    ("25.08", "25.08", "13.0.0"),
    ("25.09", "25.09", "13.0.1"),
    ("25.10", "25.11", "13.0.2"),
    ("25.12", "25.12", "13.1.0"),
)

#: tensorflow/tensorflow:<X.Y>-gpu ranges (first, last, CUDA), FACTS.md §4.
TENSORFLOW_RELEASES: tuple[tuple[str, str, str], ...] = (
    ("2.11", "2.11", "11.2"),
    ("2.12", "2.14", "11.8"),
    ("2.15", "2.15", "12.2"),
    ("2.16", "2.17", "12.3"),
    ("2.18", "2.19", "12.5"),
)

_CUDA_TAG = re.compile(r"^(\d+\.\d+(?:\.\d+)?)(?:-|$)")
_PYTORCH_TAG = re.compile(r"-cuda(\d+\.\d+)(?:-|$)")
_NGC_TAG = re.compile(r"^(\d{2})\.(\d{2})(?:\.\d+)?(?:-|$)")
_TENSORFLOW_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?(?:rc\d+)?-gpu(?:-|$)")


@dataclass(frozen=True)
class ImageRef:
    """An image reference split up; Docker Hub names get their implicit parts."""

    registry: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        name = image.strip().split("@", 1)[0]
        slash, colon = name.rfind("/"), name.rfind(":")
        tag = name[colon + 1:] if colon > slash else ""
        name = name[:colon] if colon > slash else name
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = "docker.io", name
        if registry in _DOCKER_HUB:
            registry = "docker.io"
            path = path if "/" in path else f"library/{path}"
        return cls(registry, path, tag)


@dataclass(frozen=True)
class Inferred:
    """A container's CUDA version and where it was read from (for messages)."""

    version: CudaVersion
    source: str


def infer(
    container_name: str,
    image: str,
    annotations: Mapping[str, str],
    rules: Sequence[tuple[str, str]] = (),
) -> Inferred | str:
    """The container's CUDA version, or why it is unknown.

    ``rules`` are the policy's (image glob, CUDA version) pairs; the first
    glob that matches the image as written in the pod spec wins.
    """
    for key in (f"{ANNOTATION}.{container_name}", ANNOTATION):
        if key in annotations:
            version = CudaVersion.parse(str(annotations[key]))
            if version is None:
                return f"annotation {key}={annotations[key]!r} is not a CUDA version such as 12.4"
            return Inferred(version, f"annotation {key}")
    for pattern, cuda in rules:
        if fnmatchcase(image, pattern):
            version = CudaVersion.parse(cuda)
            if version is not None:
                return Inferred(version, f"policy image map {pattern}")
    from_tag = from_image(image)
    if from_tag is not None:
        return from_tag
    return "no CUDA version known for its image"


def from_image(image: str) -> Inferred | None:
    """CUDA from the image's tag, by the conventions FACTS.md §4 lists."""
    ref = ImageRef.parse(image)
    owner, _, repo = ref.repository.rpartition("/")
    if ref.repository == "nvidia/cuda":  # Docker Hub, nvcr.io or a mirror
        return _tagged(_CUDA_TAG.search(ref.tag), "nvidia/cuda tag")
    if ref.repository == "pytorch/pytorch":
        return _tagged(_PYTORCH_TAG.search(ref.tag), "pytorch/pytorch tag")
    if ref.registry == "nvcr.io" and owner == "nvidia" and repo in NGC_FRAMEWORKS:
        match = _NGC_TAG.match(ref.tag)
        release = f"{match[1]}.{match[2]}" if match else ""
        version = ngc_cuda(release) if match else None
        return Inferred(version, f"NGC {release}") if version else None
    if ref.repository == "tensorflow/tensorflow":
        match = _TENSORFLOW_TAG.match(ref.tag)
        release = f"{match[1]}.{match[2]}" if match else ""
        version = tensorflow_cuda(release) if match else None
        return Inferred(version, f"TensorFlow {release}") if version else None
    return None


def ngc_cuda(release: str) -> CudaVersion | None:
    """The CUDA of an NGC framework release such as ``24.05``."""
    yy, _, mm = release.partition(".")
    return _in_ranges(NGC_RELEASES, (int(yy), int(mm))) if yy.isdigit() and mm.isdigit() else None


def tensorflow_cuda(release: str) -> CudaVersion | None:
    """The CUDA of a TensorFlow GPU image release such as ``2.15``."""
    major, _, minor = release.partition(".")
    return _in_ranges(TENSORFLOW_RELEASES, (int(major), int(minor))) if major.isdigit() and minor.isdigit() else None


def _tagged(match: re.Match[str] | None, source: str) -> Inferred | None:
    version = CudaVersion.parse(match[1]) if match else None
    return Inferred(version, source) if version else None


def _in_ranges(table: Sequence[tuple[str, str, str]], release: tuple[int, int]) -> CudaVersion | None:
    for first, last, cuda in table:
        if _pair(first) <= release <= _pair(last):
            return CudaVersion.parse(cuda)
    return None


def _pair(text: str) -> tuple[int, int]:
    a, _, b = text.partition(".")
    return int(a), int(b)

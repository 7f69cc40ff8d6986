"""Which CUDA version a container image carries, from what admission can see.

Sources, most specific first: a per-container pod annotation, a pod
annotation, the policy's image → CUDA map, the image's own config when a
registry resolver has read it (``CUDA_VERSION``, ``NVIDIA_REQUIRE_CUDA``),
then what the name tells: the tag conventions of FACTS.md §4 (``nvidia/cuda``,
``pytorch/pytorch``), the release table of widely used images
(:mod:`webhook.gpu.image_table`: NGC frameworks, TensorFlow, TGI, vLLM …),
CUDA spelled in the tag (``cuda11.7.1``, ``cu121``, ``-cuda12.4-``), and
images known to carry no CUDA (``ubuntu``, ``busybox``, ``python`` …).
Nothing here does I/O: the resolver (``webhook.registry``) runs in the shell.
tests/test_images.py checks the NGC and TensorFlow tables row by row against
FACTS.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from types import MappingProxyType

from webhook.gpu import forward_compat, image_table
from webhook.gpu.cuda import CudaVersion
from webhook.gpu.forward_compat import Branch

#: pod annotation stating the CUDA version of every GPU container;
#: ``<ANNOTATION>.<container name>`` states one container's.
ANNOTATION = "gpu-admission.io/cuda-version"

#: what a policy's image map or an annotation says for an image without CUDA
NO_CUDA = "none"

_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}

#: an image reference as the distribution spec writes it (domain, lowercase path, tag, digest)
_REFERENCE = re.compile(
    r"^(?:[A-Za-z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::\w[\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_CUDA_TAG = re.compile(r"^(\d+\.\d+(?:\.\d+)?)(?:-|$)")
_PYTORCH_TAG = re.compile(r"-cuda(\d+\.\d+)(?:-|$)")
#: CUDA spelled in a tag: cuda11.7.1, cuda-12.2, cuda_12.4 … and PyTorch's cu121
_CUDA_IN_TAG = re.compile(r"(?:^|[-_.])(cuda[-_]?(\d{1,2}\.\d{1,2}(?:\.\d{1,3})?))(?=$|[-_])")
_CU_IN_TAG = re.compile(r"(?:^|[-_.])(cu(\d{1,2})(\d))(?=$|[-_.])")


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

    @property
    def name(self) -> str:
        """``registry/repository``, as the image table names repositories."""
        return f"{self.registry}/{self.repository}"


def is_reference(image: str) -> bool:
    """Whether ``image`` is a well-formed image reference (not a template placeholder)."""
    return bool(_REFERENCE.match(image))


@dataclass(frozen=True)
class Inferred:
    """A container's CUDA version and where it was read from (for messages).

    ``version`` None: the image carries no CUDA. ``branches``: the driver
    branches its cuda-compat package runs it on (data-center GPUs only).
    """

    version: CudaVersion | None
    source: str
    branches: tuple[Branch, ...] = ()


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config says about CUDA, read from a registry at a digest."""

    digest: str
    env: Mapping[str, str]

    def inferred(self) -> Inferred | None:
        """The CUDA its environment states; None when it states none (CUDA may come from pip wheels)."""
        requirement = forward_compat.parse_requirement(self.env.get("NVIDIA_REQUIRE_CUDA", ""))
        version = CudaVersion.parse(self.env.get("CUDA_VERSION", "")) or requirement.cuda
        if version is None:
            return None
        return Inferred(version, f"image config at {self.digest[:19]}", requirement.branches)


def infer(
    container_name: str,
    image: str,
    annotations: Mapping[str, str],
    rules: Sequence[tuple[str, str]] = (),
    config: ImageConfig | None = None,
) -> Inferred | str:
    """The container's CUDA version, or why it is unknown.

    ``rules`` are the policy's (image glob, CUDA version or "none") pairs; the
    first glob that matches the image as written in the pod spec wins.
    ``config`` is what a registry resolver read from the image, if anything.
    """
    for key in (f"{ANNOTATION}.{container_name}", ANNOTATION):
        if key in annotations:
            return _stated(str(annotations[key]), f"annotation {key}") or (
                f"annotation {key}={annotations[key]!r} is not a CUDA version such as 12.4"
            )
    for pattern, cuda in rules:
        if fnmatchcase(image, pattern):
            stated = _stated(cuda, f"policy image map {pattern}")
            if stated is not None:
                return stated
    from_config = config.inferred() if config is not None else None
    if from_config is not None:
        return from_config
    found = from_image(image)
    if found is not None:
        return found
    if not is_reference(image):
        return "its image is not a valid image reference (a template placeholder?)"
    return "no CUDA version known for its image"


def _stated(text: str, source: str) -> Inferred | None:
    if text.strip().lower() == NO_CUDA:
        return Inferred(None, source)
    version = CudaVersion.parse(text)
    return Inferred(version, source) if version is not None else None


def from_image(image: str) -> Inferred | None:
    """CUDA from the image's name: tag conventions, the release table, CUDA in the tag, no-CUDA bases."""
    ref = ImageRef.parse(image)
    if not ref.repository:
        return None
    if ref.repository == "nvidia/cuda":  # Docker Hub, nvcr.io or a mirror
        found = _tagged(_CUDA_TAG.search(ref.tag), "nvidia/cuda tag")
        require = image_table.NVIDIA_CUDA_REQUIRE.get(str(found.version)) if found else None
        return replace(found, branches=forward_compat.parse_requirement(require).branches) if found and require else found
    if ref.repository == "pytorch/pytorch":
        return _tagged(_PYTORCH_TAG.search(ref.tag), "pytorch/pytorch tag")
    return _from_table(ref) or _from_tag(ref.tag) or _without_cuda(ref)


@dataclass(frozen=True)
class _Row:
    """A release-table row read once: its tag pattern compiled, its release bounds parsed."""

    release: image_table.Release
    tag: re.Pattern[str]
    bounds: tuple[tuple[int, ...], tuple[int, ...]] | None


def _rows_by_repository(rows: Sequence[image_table.Release]) -> Mapping[str, tuple[_Row, ...]]:
    """Each repository's rows, in table order (the first that matches wins)."""
    found: dict[str, list[_Row]] = {}
    for release in rows:
        bounds = (_numbers(release.first), _numbers(release.last)) if release.first else None
        row = _Row(release, re.compile(release.tag), bounds)
        for repository in release.repositories:
            found.setdefault(repository, []).append(row)
    return MappingProxyType({name: tuple(same) for name, same in found.items()})


def _from_table(ref: ImageRef) -> Inferred | None:
    # every GPU container of every admission asks: only the image's own repository's rows are read
    parsed: dict[str, tuple[int, ...]] = {}  # the rows of one project share their tag pattern
    for compiled in _TABLE.get(ref.name, ()):
        match = compiled.tag.fullmatch(ref.tag)
        if match is None:
            continue
        row = compiled.release
        release = match[1] if match.re.groups else ""
        if compiled.bounds:
            numbers = parsed.get(release)
            if numbers is None:
                numbers = parsed[release] = _numbers(release)
            if not compiled.bounds[0] <= numbers <= compiled.bounds[1]:
                continue
        version = CudaVersion.parse(row.cuda)
        if version is not None:
            source = f"{row.name} {release}" if release else f"{row.name}, image table"
            branches = (forward_compat.ngc_branches(_numbers(release)) if row.name == "NGC"
                        else forward_compat.parse_requirement(row.require).branches)
            return Inferred(version, source, branches)
    return None


def _from_tag(tag: str) -> Inferred | None:
    spelled = _CUDA_IN_TAG.search(tag)
    if spelled:
        version = CudaVersion.parse(spelled[2])
        return Inferred(version, f"tag {spelled[1]}") if version else None
    cu = _CU_IN_TAG.search(tag)
    return Inferred(CudaVersion(int(cu[2]), int(cu[3])), f"tag {cu[1]}") if cu else None


def _without_cuda(ref: ImageRef) -> Inferred | None:
    if any(fnmatchcase(ref.name, pattern) for pattern in image_table.NO_CUDA):
        return Inferred(None, f"{ref.repository} carries no CUDA")
    return None


def ngc_cuda(release: str) -> CudaVersion | None:
    """The CUDA of an NGC framework release such as ``24.05``."""
    return _in_ranges(image_table.NGC_RELEASES, release)


def tensorflow_cuda(release: str) -> CudaVersion | None:
    """The CUDA of a TensorFlow GPU image release such as ``2.15``."""
    return _in_ranges(image_table.TENSORFLOW_TESTED_BUILDS + image_table.TENSORFLOW_RELEASES, release)


def _tagged(match: re.Match[str] | None, source: str) -> Inferred | None:
    version = CudaVersion.parse(match[1]) if match else None
    return Inferred(version, source) if version else None


def _in_ranges(table: Sequence[tuple[str, str, str]], release: str) -> CudaVersion | None:
    wanted = _numbers(release)
    if not wanted:
        return None
    for first, last, cuda in table:
        if _numbers(first) <= wanted <= _numbers(last):
            return CudaVersion.parse(cuda)
    return None


def _numbers(text: str) -> tuple[int, ...]:
    """``"24.05"`` → (24, 5); anything not dotted numbers → ()."""
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


_TABLE = _rows_by_repository(image_table.RELEASES)

"""CUDA forward compatibility: which older driver branches run a newer CUDA through the
cuda-compat package an image ships, and on which GPUs.

Sources:
- NVIDIA CUDA Compatibility guide, "Forward Compatibility": applicable only to
  NVIDIA data-center GPUs (and select NGC Server Ready RTX SKUs, Jetson);
  elsewhere CUDA fails with error 804 (cudaErrorCompatNotSupportedOnDevice).
- NGC framework release notes, "Driver Requirements": per release, the driver
  branches (and the oldest driver of each) that run it in forward-compatibility
  mode on data-center GPUs. ``NGC_BRANCHES`` holds them.
- An image's own ``NVIDIA_REQUIRE_CUDA`` (NVIDIA CUDA base images and what is
  built on them): ``cuda>=X.Y brand=tesla,driver>=470,driver<471 …``; space
  separates alternatives, a comma joins conditions (FACTS.md §4). The
  ``brand=tesla`` alternatives are the branches its cuda-compat supports.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.gpu.cuda import CudaVersion, DriverVersion


@dataclass(frozen=True)
class Branch:
    """A driver branch (major version) that runs the image, from its oldest supported driver."""

    major: int
    minimum: DriverVersion

    def admits(self, driver: DriverVersion) -> bool:
        return driver.parts[0] == self.major and driver >= self.minimum

    def __str__(self) -> str:
        return f"R{self.major}"


def branches(*minimums: str) -> tuple[Branch, ...]:
    """``branches("470.57", "535.86")``: one branch per oldest driver."""
    drivers = [DriverVersion.parse(m) for m in minimums]
    return tuple(Branch(d.parts[0], d) for d in drivers if d is not None)


_NGC_2025 = "NGC release notes 25.10 and 26.05 (SGLang), Driver Requirements"
# The 22.xx-24.xx statements were not read: only the two long-term branches that the 25.x/26.x
# statements still list (so NVIDIA kept them forward-compatible throughout) are assumed;
# issue #17 cites NGC PyTorch 24.01 on R535. A policy adds more with driverBranches.
_NGC_LTS = "inferred: the long-term branches R470/R535 of the 25.10 and 26.05 statements; 24.01 on R535 (issue #17)"

#: NGC release ranges (first, last YY.MM) → branches forward compatibility supports, and the source.
NGC_BRANCHES: tuple[tuple[str, str, tuple[Branch, ...], str], ...] = (
    ("21.07", "21.07", branches("418.40", "440.33", "450.51", "460.27"), "NGC 21.07 release notes (DLProf), Driver Requirements"),
    ("22.01", "24.12", branches("470.57", "535.86"), _NGC_LTS),
    ("25.01", "26.12", branches("470.57", "525.85", "535.86", "550.54"), _NGC_2025),
)


def ngc_branches(release: tuple[int, ...]) -> tuple[Branch, ...]:
    """The forward-compatible branches of an NGC release such as (24, 1)."""
    for first, last, found, _ in NGC_BRANCHES:
        if _pair(first) <= release <= _pair(last):
            return found
    return ()


_CUDA_REQ = re.compile(r"^cuda>=(\d+\.\d+(?:\.\d+)?)$")
_DRIVER_REQ = re.compile(r"^driver([<>]=?)(\d+(?:\.\d+)*)$")


@dataclass(frozen=True)
class Requirement:
    """An image's ``NVIDIA_REQUIRE_CUDA``: the CUDA it needs and the branches its cuda-compat runs on."""

    cuda: CudaVersion | None
    branches: tuple[Branch, ...]


def parse_requirement(text: str) -> Requirement:
    """``cuda>=12.4 brand=tesla,driver>=470,driver<471 …`` → CUDA 12.4 and branch R470."""
    cuda: CudaVersion | None = None
    found: list[Branch] = []
    for alternative in text.split():
        conditions = alternative.split(",")
        whole = _CUDA_REQ.match(alternative)
        if whole:
            cuda = CudaVersion.parse(whole[1])
        elif "brand=tesla" in conditions:
            branch = _branch(conditions)
            if branch is not None:
                found.append(branch)
    return Requirement(cuda, tuple(found))


def _branch(conditions: Sequence[str]) -> Branch | None:
    """``driver>=470,driver<471`` → R470 from driver 470; None for anything wider than one branch."""
    low: DriverVersion | None = None
    high: DriverVersion | None = None
    for condition in conditions:
        match = _DRIVER_REQ.match(condition)
        version = DriverVersion.parse(match[2]) if match else None
        if match and version is not None:
            low, high = (version, high) if match[1].startswith(">") else (low, version)
    if low is None or high is None or high.parts[0] != low.parts[0] + 1 or high.parts[1:] != (0, 0):
        return None
    return Branch(low.parts[0], low)


def _pair(text: str) -> tuple[int, int]:
    a, _, b = text.partition(".")
    return int(a), int(b)

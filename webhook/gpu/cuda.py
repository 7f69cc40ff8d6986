"""CUDA toolkit versions, NVIDIA driver versions, and which driver runs which CUDA.

Sources: FACTS.md §1 (NVIDIA CUDA release notes, Table 3 for the strict
minimum drivers, Table 2 for minor-version compatibility) and §2 (the node
labels GPU Feature Discovery sets, in both spellings). tests/test_cuda.py
checks the table here row by row against FACTS.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Compatibility = Literal["strict", "minor-version"]

_CUDA = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")
_DRIVER = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


@dataclass(frozen=True, order=True)
class CudaVersion:
    """X.Y or X.Y.Z. A missing patch means the X.Y release itself (GA)."""

    major: int
    minor: int
    patch: int | None = None

    @classmethod
    def parse(cls, text: str) -> CudaVersion | None:
        match = _CUDA.match(text.strip())
        if match is None:
            return None
        major, minor, patch = match.groups()
        return cls(int(major), int(minor), int(patch) if patch is not None else None)

    @property
    def release(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch or 0)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" + (f".{self.patch}" if self.patch is not None else "")


@dataclass(frozen=True, order=True)
class DriverVersion:
    """An NVIDIA driver version such as 535.104.05, compared numerically."""

    parts: tuple[int, int, int]
    text: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> DriverVersion | None:
        match = _DRIVER.match(text.strip())
        if match is None:
            return None
        numbers = [int(g) if g else 0 for g in match.groups()]
        return cls((numbers[0], numbers[1], numbers[2]), text.strip())

    def __str__(self) -> str:
        return self.text


#: (CUDA releases, minimum Linux x86_64 driver), FACTS.md §1, newest first.
STRICT_TABLE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("13.2.2",), "595.71.05"),
    (("13.2.1",), "595.58.03"),
    (("13.2.0",), "595.45.04"),
    (("13.1.1",), "590.48.01"),
    (("13.1.0",), "590.44.01"),
    (("13.0.2",), "580.95.05"),
    (("13.0.1",), "580.82.07"),
    (("13.0.0",), "580.65.06"),
    (("12.9.1",), "575.57.08"),
    (("12.9.0",), "575.51.03"),
    (("12.8.1",), "570.124.06"),
    (("12.8.0",), "570.26"),
    (("12.6.3",), "560.35.05"),
    (("12.6.1", "12.6.2"), "560.35.03"),
    (("12.6.0",), "560.28.03"),
    (("12.5.1",), "555.42.06"),
    (("12.5.0",), "555.42.02"),
    (("12.4.1",), "550.54.15"),
    (("12.4.0",), "550.54.14"),
    (("12.3.1",), "545.23.08"),
    (("12.3.0",), "545.23.06"),
    (("12.2.2",), "535.104.05"),
    (("12.2.1",), "535.86.09"),
    (("12.2.0",), "535.54.03"),
    (("12.1.0", "12.1.1"), "530.30.02"),
    (("12.0.1",), "525.85.12"),
    (("12.0.0",), "525.60.13"),
    (("11.8.0",), "520.61.05"),
    (("11.7.1",), "515.48.07"),
    (("11.7.0",), "515.43.04"),
    (("11.6.1", "11.6.2"), "510.47.03"),
    (("11.6.0",), "510.39.01"),
    (("11.5.0", "11.5.1", "11.5.2"), "495.29.05"),
    (("11.4.3", "11.4.4"), "470.82.01"),
    (("11.4.1", "11.4.2"), "470.57.02"),
    (("11.4.0",), "470.42.01"),
    (("11.3.0", "11.3.1"), "465.19.01"),
    (("11.2.1", "11.2.2"), "460.32.03"),
    (("11.2.0",), "460.27.03"),
    (("11.1.1",), "455.32"),
    (("11.1.0",), "455.23"),
    (("11.0.3",), "450.51.06"),
)

#: Releases before 11.0.3 that FACTS.md §1 leaves out, from the same NVIDIA table
#: (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions",
#: editions up to 11.x list them): images built on them are still pulled.
LEGACY_TABLE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("11.0.2",), "450.51.05"),
    (("10.2.0",), "440.33"),
    (("10.1.0",), "418.39"),
    (("10.0.0",), "410.48"),
    (("9.2.1",), "396.37"),  # 9.2.148 Update 1
    (("9.2.0",), "396.26"),
    (("9.1.0",), "390.46"),
    (("9.0.0",), "384.81"),
    (("8.0.1",), "375.26"),  # 8.0.61 GA2: images say CUDA_VERSION=8.0.61, above this row
    (("8.0.0",), "367.48"),
)

#: CUDA major → the driver minor-version compatibility needs (FACTS.md §1).
MINOR_VERSION_FLOOR: dict[int, str] = {13: "580", 12: "525.60.13", 11: "450.80.02"}


def strict_index(extra: Mapping[str, str] | None = None) -> dict[tuple[int, int, int], DriverVersion]:
    """CUDA release → minimum driver: the table plus a policy's extra rows (which win)."""
    index: dict[tuple[int, int, int], DriverVersion] = {}
    rows = [*LEGACY_TABLE, *STRICT_TABLE, *(((cuda,), driver) for cuda, driver in (extra or {}).items())]
    for releases, driver_text in rows:
        driver = DriverVersion.parse(driver_text)
        for text in releases:
            version = CudaVersion.parse(text)
            if driver is not None and version is not None:
                index[version.release] = driver
    return index


def min_driver(
    cuda: CudaVersion, mode: Compatibility, index: Mapping[tuple[int, int, int], DriverVersion]
) -> DriverVersion | None:
    """The oldest driver that runs ``cuda``; None when no table says.

    A release missing from the table takes the row of the nearest older
    update of the same X.Y (updates without a row need no newer driver),
    else the nearest newer one (stricter, never laxer).
    """
    same_minor = sorted(r for r in index if r[:2] == cuda.release[:2])
    older = [r for r in same_minor if r <= cuda.release]
    strict = index[older[-1]] if older else (index[same_minor[0]] if same_minor else None)
    if mode == "strict":
        return strict
    floor_text = MINOR_VERSION_FLOOR.get(cuda.major)
    floor = DriverVersion.parse(floor_text) if floor_text else None
    if floor is None or strict is None:
        return floor or strict
    return min(floor, strict)


#: GFD node labels for the driver version (FACTS.md §2): current, then deprecated.
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
_DRIVER_PARTS = (
    (DRIVER_MAJOR, DRIVER_MINOR, "nvidia.com/cuda.driver-version.revision"),
    ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"),
)


def node_driver(labels: Mapping[str, str]) -> DriverVersion | None:
    """The node's driver version from GFD labels, either spelling; None when unlabelled."""
    full = labels.get(DRIVER_FULL)
    if full:
        return DriverVersion.parse(full)
    for major_key, minor_key, rev_key in _DRIVER_PARTS:
        major, minor = labels.get(major_key), labels.get(minor_key)
        if major and minor:
            # the revision keeps its leading zeros and may be empty
            rev = labels.get(rev_key) or ""
            return DriverVersion.parse(".".join(p for p in (major, minor, rev) if p))
    return None


def newest_supported(driver: DriverVersion, index: Mapping[tuple[int, int, int], DriverVersion]) -> CudaVersion | None:
    """The newest CUDA release the table says ``driver`` runs (strictly)."""
    runs = [release for release, needed in index.items() if needed <= driver]
    return CudaVersion(*max(runs)) if runs else None

"""The CUDA → driver table and driver labels, checked against FACTS.md §1 and §2."""

from __future__ import annotations

import re

import pytest

from tests.facts import cuda_releases, section, table_rows
from webhook.gpu import cuda
from webhook.gpu.cuda import CudaVersion, DriverVersion


def facts_table() -> dict[str, str]:
    """CUDA release (X.Y.Z) → minimum driver, from the markdown table of FACTS.md §1."""
    table: dict[str, str] = {}
    for cells in table_rows(section(1)):
        for notation, driver in zip(cells[0::2], cells[1::2]):
            if notation:
                table.update(dict.fromkeys(cuda_releases(notation), driver))
    return table


FACTS_ROWS = sorted(facts_table().items())


def test_facts_table_was_read() -> None:
    # 42 rows in FACTS §1, several covering more than one release
    assert len(FACTS_ROWS) >= 42
    assert dict(FACTS_ROWS)["12.2.2"] == "535.104.05"


@pytest.mark.parametrize(("release", "driver"), FACTS_ROWS, ids=[r for r, _ in FACTS_ROWS])
def test_code_table_matches_facts_row_by_row(release: str, driver: str) -> None:
    version = CudaVersion.parse(release)
    assert version is not None
    found = cuda.min_driver(version, "strict", cuda.strict_index())
    assert found is not None and found.text == driver


def test_code_table_has_no_row_facts_lacks() -> None:
    """Beyond FACTS.md, only the pre-11.0.3 rows of the same NVIDIA table (LEGACY_TABLE)."""
    code = {f"{a}.{b}.{c}": d.text for (a, b, c), d in cuda.strict_index().items()}
    legacy = {release: driver for releases, driver in cuda.LEGACY_TABLE for release in releases}
    assert code == dict(FACTS_ROWS) | legacy
    assert all(tuple(int(x) for x in r.split(".")) < (11, 0, 3) for r in legacy)


def test_minor_version_floors_match_facts() -> None:
    text = " ".join(section(1).split())
    floors = dict(re.findall(r"(\d+)\.x (?:runs )?on (?:driver )?>= ([\d.]+)", text))
    assert floors == {str(k): v for k, v in cuda.MINOR_VERSION_FLOOR.items()}


@pytest.mark.parametrize(
    ("release", "mode", "driver"),
    [
        ("12.3.2", "strict", "545.23.08"),  # no row: the nearest older update of 12.3
        ("12.4", "strict", "550.54.14"),  # X.Y means the GA release
        ("12.8.2", "strict", "570.124.06"),
        ("11.0", "strict", "450.51.05"),  # X.Y is GA: 11.0.2, the first 11.0 release
        ("11.0.1", "strict", "450.51.05"),  # no older 11.0 row: the nearest newer, never laxer
        ("8.0.61", "strict", "375.26"),  # GA2, as nvidia/cuda:8.0 images state it
        ("12.7", "strict", None),  # there is no CUDA 12.7
        ("14.0", "strict", None),
        ("12.7", "minor-version", "525.60.13"),
        ("12.9.1", "minor-version", "525.60.13"),
        ("13.1.0", "minor-version", "580"),
        ("11.0.3", "minor-version", "450.51.06"),  # the strict row is older than the floor
        ("10.2", "minor-version", "440.33"),  # no minor-version compatibility before 11: the strict row
    ],
)
def test_min_driver(release: str, mode: cuda.Compatibility, driver: str | None) -> None:
    version = CudaVersion.parse(release)
    assert version is not None
    found = cuda.min_driver(version, mode, cuda.strict_index())
    assert (found.text if found else None) == driver


def test_policy_rows_extend_and_override_the_table() -> None:
    index = cuda.strict_index({"10.2": "440.33", "12.4.1": "550.90.07"})
    assert str(cuda.min_driver(CudaVersion(10, 2, 89), "strict", index)) == "440.33"
    assert str(cuda.min_driver(CudaVersion(12, 4, 1), "strict", index)) == "550.90.07"


def test_driver_versions_compare_numerically() -> None:
    parse = DriverVersion.parse

    def version(text: str) -> DriverVersion:
        parsed = parse(text)
        assert parsed is not None, text
        return parsed

    assert parse("535.104.05") == parse("535.104.5")
    assert version("570.26") < version("570.124.06") < version("580")
    assert version("9.1") < version("10.0")
    assert parse("not-a-version") is None


@pytest.mark.parametrize(
    ("labels", "driver"),
    [
        ({"nvidia.com/cuda.driver-version.full": "550.54.15"}, "550.54.15"),
        (
            {
                "nvidia.com/cuda.driver-version.major": "535",
                "nvidia.com/cuda.driver-version.minor": "104",
                "nvidia.com/cuda.driver-version.revision": "05",
            },
            "535.104.05",
        ),
        ({"nvidia.com/cuda.driver-version.major": "570", "nvidia.com/cuda.driver-version.minor": "26",
          "nvidia.com/cuda.driver-version.revision": ""}, "570.26"),
        ({"nvidia.com/cuda.driver.major": "470", "nvidia.com/cuda.driver.minor": "82", "nvidia.com/cuda.driver.rev": "01"},
         "470.82.01"),
        ({"nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "129"}, "535.129"),
        ({"nvidia.com/cuda.runtime-version.full": "12.4"}, None),  # the runtime label is not the driver
        ({}, None),
    ],
    ids=["full", "parts", "empty-revision", "deprecated", "deprecated-no-rev", "runtime-only", "none"],
)
def test_node_driver_reads_both_label_spellings(labels: dict[str, str], driver: str | None) -> None:
    found = cuda.node_driver(labels)
    assert (str(found) if found else None) == driver


def test_newest_supported_cuda_of_a_driver() -> None:
    index = cuda.strict_index()
    assert str(cuda.newest_supported(DriverVersion.parse("535.104.05"), index)) == "12.2.2"  # type: ignore[arg-type]
    assert str(cuda.newest_supported(DriverVersion.parse("470.82.01"), index)) == "11.4.4"  # type: ignore[arg-type]
    assert str(cuda.newest_supported(DriverVersion.parse("440.33"), index)) == "10.2.0"  # type: ignore[arg-type]
    assert cuda.newest_supported(DriverVersion.parse("360.0"), index) is None  # type: ignore[arg-type]

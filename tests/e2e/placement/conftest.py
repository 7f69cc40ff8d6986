"""The placement suite: the real kube-scheduler and kube-controller-manager beside the suite's
kube-apiserver, for this package only (tests/e2e/control_plane.py).

Started once for the package and stopped after it, so every other e2e test
keeps a cluster where nothing schedules or reconciles. On versions whose
binaries install.sh does not ship (all but 1.36.2) the package skips with
that reason; on 1.36.2 a missing binary is a failure where
``GPU_ADMISSION_E2E=required``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.admission import Admission
from tests.e2e.apiserver import ApiServer, Unavailable
from tests.e2e.control_plane import VERSION, ControlPlane
from tests.e2e.kube import Kube
from tests.e2e.placement.pool import Pool
from tests.support import unavailable


@pytest.fixture(scope="package")
def control_plane(apiserver: ApiServer, admission: Admission, workdir: Path) -> Iterator[ControlPlane]:
    if apiserver.version != VERSION:
        pytest.skip(f"placement tests: kube-scheduler and kube-controller-manager are shipped for {VERSION} only "
                    f"(kube-apiserver here is {apiserver.version})")
    plane = ControlPlane(apiserver, workdir / "control-plane")
    try:
        plane.start()
    except Unavailable as exc:
        unavailable(f"placement tests: {exc} (../shared/tools/kube-apiserver/install.sh {VERSION} unpacks them)")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def pool(control_plane: ControlPlane, admin: Kube, admission: Admission) -> Iterator[Pool]:
    """A node pool of this case's own; its nodes, workloads and pods are deleted at the end."""
    made = Pool(admin, admission)
    yield made
    made.cleanup()
    assert all(control_plane.alive().values()), control_plane.alive()

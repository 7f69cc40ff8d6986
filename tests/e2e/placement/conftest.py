"""The placement suite: the real kube-scheduler and kube-controller-manager beside the suite's
kube-apiserver, for this package only (tests/e2e/control_plane.py).

Started once for the package and stopped after it, so every other e2e test
keeps a cluster where nothing schedules or reconciles. On versions whose
binaries install.sh does not ship (all but 1.36.2) the package skips with
that reason; on 1.36.2 a missing binary is a failure where
``GPU_ADMISSION_E2E=required``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.admission import Admission
from tests.e2e.apiserver import ApiServer, Unavailable
from tests.e2e.control_plane import VERSION, ControlPlane
from tests.e2e.conftest import OPT_IN
from tests.e2e.fixtures import PLACEMENT_CAP_LABEL, PLACEMENT_CAP_POLICY, wait_for_view
from tests.e2e.kube import Kube, eventually
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


def _reloads(admission: Admission) -> float:
    return admission.metric('gpu_admission_policy_reloads_total{result="success"}')


@pytest.fixture(scope="package")
def team_cap(control_plane: ControlPlane, admission: Admission) -> Iterator[str]:
    """The e2e-placement-cap policy (a team cap of 8 GPUs in namespaces labelled for it) in the server's
    policy directory while this package runs; its label."""
    path = admission.policies / "e2e-placement-cap.yaml"
    before = _reloads(admission)
    path.write_text(PLACEMENT_CAP_POLICY)
    eventually(lambda: _reloads(admission) > before, timeout=30, what="the server loading e2e-placement-cap")
    try:
        yield PLACEMENT_CAP_LABEL
    finally:
        before = _reloads(admission)
        path.unlink()
        eventually(lambda: _reloads(admission) > before, timeout=30, what="the server dropping e2e-placement-cap")


@pytest.fixture
def capped_namespaces(team_cap: str, admin: Kube, admission: Admission) -> Iterator[Callable[[int], list[str]]]:
    """Makes opted-in namespaces under the team cap, each of a new team of its own."""
    made: list[str] = []

    def make(count: int) -> list[str]:
        names = [f"e2e-cap-{uuid.uuid4().hex[:8]}" for _ in range(count)]
        for name in names:
            admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
                OPT_IN: "true", team_cap: "on", "team": f"team-{name}"}}})
        made.extend(names)
        wait_for_view(admin, admission, "namespaces", "v1", "Namespace")
        return names

    yield make
    for name in made:
        admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

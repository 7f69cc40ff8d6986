"""Fixtures of the end-to-end suite: one real apiserver and one gpu-admission per run, a namespace per test.

Skipped, with the reason, when no kube-apiserver can be had (see
tests/e2e/apiserver.py); ``GPU_ADMISSION_E2E=required`` turns that into a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e import fixtures
from tests.e2e.admission import Admission
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, Unavailable, find_assets
from tests.e2e.fixtures import BURST_LABEL, wait_for_view
from tests.e2e.kube import Kube
from tests.support import POLICIES, unavailable

OPT_IN = "gpu-admission.io/enabled"


def pytest_report_header() -> str:
    return f"e2e: KUBEBUILDER_ASSETS={os.environ.get('KUBEBUILDER_ASSETS', '(unset)')}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the last lines of what gpu-admission and kube-apiserver logged
    (their folders go with the run: a failure in CI is read from its report alone)."""
    report = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        admission, apiserver = funcargs.get("admission"), funcargs.get("apiserver")
        if isinstance(admission, Admission):
            report.sections.append(("gpu-admission log (last lines)", admission.log_tail(80)))
        if isinstance(apiserver, ApiServer):
            report.sections.append(("kube-apiserver log (last lines)", apiserver.log_tail("kube-apiserver", 40)))
    return report


#: the namespace labels that let a namespace's pods choose each shipped workload class by label
ALLOW_CLASSES = {f"workload-classes.gpu-admission.io/{c}": "true" for c in ("training", "inference", "notebook")}

@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpu-admission-e2e-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def apiserver(workdir: Path) -> Iterator[ApiServer]:
    try:
        assets = find_assets()
    except Unavailable as exc:
        unavailable(f"end-to-end suite: {exc}")
    server = ApiServer(assets, workdir / "kube")
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def admin(apiserver: ApiServer, workdir: Path) -> Iterator[Kube]:
    kube = Kube(apiserver.kubeconfig(workdir / "e2e-admin.kubeconfig", ADMIN_TOKEN))
    yield kube
    kube.close()


@pytest.fixture(scope="session")
def admission(apiserver: ApiServer, admin: Kube, workdir: Path) -> Iterator[Admission]:
    policies = workdir / "policies"
    shutil.copytree(POLICIES, policies)
    (policies / "e2e-quota.yaml").write_text(fixtures.QUOTA_POLICY)
    (policies / "e2e-burst.yaml").write_text(fixtures.BURST_POLICY)
    (policies / "e2e-reserve.yaml").write_text(fixtures.RESERVE_POLICY)
    (policies / "e2e-claims-cap.yaml").write_text(fixtures.CLAIMS_CAP_POLICY)
    (policies / "e2e-audit.yaml").write_text(fixtures.AUDIT_POLICY)
    (policies / "e2e-exceptions.yaml").write_text(fixtures.EXCEPTION)
    deployed = Admission(apiserver, admin, workdir / "gpu-admission", policies)
    deployed.install()
    deployed.start()
    try:
        yield deployed
    finally:
        deployed.stop()


@pytest.fixture
def namespace(admission: Admission, admin: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace opted in to GPU admission, whose pods may choose every workload class by label
    (``ALLOW_CLASSES``: the platform's namespace labels, issue #42 row 7)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    labels = {OPT_IN: "true", **ALLOW_CLASSES, **getattr(request, "param", {})}
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    yield name
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture
def plain_namespace(admin: Kube) -> Iterator[str]:
    """A fresh namespace that is not opted in."""
    name = f"e2e-plain-{uuid.uuid4().hex[:8]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


#: makes fresh namespaces under the e2e-burst caps, all of one new team
Burst = Callable[..., list[str]]


@pytest.fixture
def burst(admin: Kube, admission: Admission) -> Iterator[Burst]:
    """Makes fresh namespaces under the e2e-burst caps, all of one new team."""
    made: list[str] = []

    def make(count: int = 1, **labels: str) -> list[str]:
        team = f"vision-{uuid.uuid4().hex[:6]}"
        names = []
        for _ in range(count):
            name = f"e2e-burst-{uuid.uuid4().hex[:8]}"
            admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "labels": {OPT_IN: "true", BURST_LABEL: "on", "team": team, **labels}}})
            names.append(name)
        made.extend(names)
        # team caps read namespace labels from the server's view
        wait_for_view(admin, admission, "namespaces", "v1", "Namespace")
        return names

    yield make
    for name in made:
        admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

"""No silent fail-open on a broken install (issue #41): enforced GPU caps and no GPUQuotaLedger CRD is not Ready.

The server runs as ``serve`` does (its cluster index and its ledger) against
the fake API server, which serves the ledger's resource or not (its CRD
installed or not: discovery of gpu-admission.io/v1alpha1 and every request for
it 404). With a quota cap in ``enforce`` and no ledger resource, ``/readyz``
answers 503 and says why, an error is logged once (not per probe) and
``gpu_admission_quota_ledger_missing`` is 1; once the CRD is installed the
server becomes Ready. Caps only warned about need no ledger: Ready.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import FAST
from tests.conftest import StartWebhook, Webhook
from tests.fakeapi import FakeApiServer
from tests.support import POLICIES
from webhook.cluster import ClusterIndex
from webhook.ledger import serving as ledger_serving, upkeep as ledger_upkeep
from webhook.ledger.settings import LedgerSettings
from webhook.server.metrics import Metrics

NAMESPACE = "gpu-admission"


def _caps(mode: str) -> str:
    return f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: team-caps}}
spec:
  rules: {{quota: {{mode: {mode}, resourceQuotas: false, limits: [{{scope: namespace, max: 4}}]}}}}
"""


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(default_namespaces=("default", NAMESPACE, "ml")) as server:
        yield server


@pytest.fixture
def caps_dir(tmp_path: Path) -> Path:
    target = tmp_path / "caps"
    target.mkdir()
    shutil.copy(POLICIES / "workload-kinds.yaml", target)
    (target / "caps.yaml").write_text(_caps("enforce"))
    return target


async def _start(start_webhook: StartWebhook, api: FakeApiServer, policies: Path) -> Webhook:
    def cluster(metrics: Metrics) -> ClusterIndex:
        return ClusterIndex(api.api_client(), registry=metrics.registry, settings=FAST)

    def ledger(index: ClusterIndex, current: Any, metrics: Metrics) -> Any:
        return ledger_upkeep.running(api.api_client(), index, current, LedgerSettings(namespace=NAMESPACE),
                                     metrics.registry)

    return await start_webhook(policies=policies, cluster=cluster, ledger=ledger, reload_interval=0.05)


async def _ready(hook: Webhook) -> tuple[int, str]:
    async with hook.session.get(hook.base + "/readyz") as resp:
        return resp.status, await resp.text()


async def _metric(hook: Webhook, name: str) -> str:
    async with hook.session.get(hook.base + "/metrics") as resp:
        text = await resp.text()
    return next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " "))


async def _until(hook: Webhook, status: int, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got, text = await _ready(hook)
        if got == status:
            return text
        assert time.monotonic() < deadline, f"/readyz stayed {got}: {text}"
        await asyncio.sleep(0.05)


async def test_enforced_caps_without_the_ledger_crd_are_not_ready_until_it_is_installed(
    start_webhook: StartWebhook, api: FakeApiServer, caps_dir: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_serving, "RETRY_EVERY", 0.1)
    api.serve("gpuquotaledgers", False)
    caplog.set_level(logging.INFO, logger="webhook.ledger.serving")
    hook = await _start(start_webhook, api, caps_dir)
    text = await _until(hook, 503)
    for _ in range(100):  # (until the index synced and discovery answered) then the ledger's doing alone
        status, text = await _ready(hook)
        assert status == 503, text
        if "cluster view not synced" not in text and "not answered yet" not in text:
            break
        await asyncio.sleep(0.05)
    assert "GPU quota caps are enforced (policies team-caps) but the API server does not serve GPUQuotaLedgers" in text
    assert "install deploy/base/quota-ledger-crd.yaml" in text
    assert await _metric(hook, "gpu_admission_quota_ledger_missing") == "1.0"
    assert await _metric(hook, "gpu_admission_quota_ledger_served") == "0.0"
    await asyncio.sleep(0.5)  # several checks, many probes: said once
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "GPUQuotaLedgers" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]

    api.serve("gpuquotaledgers", True)  # the CRD installed: Ready, without a restart
    await _until(hook, 200)
    assert await _metric(hook, "gpu_admission_quota_ledger_missing") == "0.0"
    assert await _metric(hook, "gpu_admission_quota_ledger_served") == "1.0"
    assert any("GPUQuotaLedgers are served" in r.getMessage() for r in caplog.records)


async def test_caps_only_warned_about_need_no_ledger(
    start_webhook: StartWebhook, api: FakeApiServer, caps_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_serving, "RETRY_EVERY", 0.1)
    api.serve("gpuquotaledgers", False)
    hook = await _start(start_webhook, api, caps_dir)
    await _until(hook, 503)
    (caps_dir / "caps.yaml").write_text(_caps("warn"))  # reloaded: no cap is enforced, nothing to charge
    await _until(hook, 200)
    assert await _metric(hook, "gpu_admission_quota_ledger_missing") == "0.0"
    (caps_dir / "caps.yaml").write_text(_caps("enforce"))
    assert "does not serve GPUQuotaLedgers" in await _until(hook, 503)


async def test_a_served_ledger_is_ready(start_webhook: StartWebhook, api: FakeApiServer, caps_dir: Path) -> None:
    hook = await _start(start_webhook, api, caps_dir)
    await _until(hook, 200)
    assert await _metric(hook, "gpu_admission_quota_ledger_served") == "1.0"

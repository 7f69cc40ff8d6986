"""When the GPU quota ledger cannot be reached, each quota rule's clusterUnavailable decides, in time.

The ledger's session is pointed at a port nothing listens on (a real
connection refused), and at a listener that accepts and never answers (an API
server that hangs): fail-open allows the pod with a warning, fail-closed
refuses it, both saying why, both within the budget, both counted.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from tests.support import POLICIES, free_port
from webhook.cluster.session import ApiSession
from webhook.ledger.charger import Ledger
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.server import charging
from webhook.view.snapshot import SnapshotView

BUDGET = 0.5


def _policies(unavailable: str) -> loader.PolicySet:
    policy = f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: caps}}
spec:
  rules: {{quota: {{clusterUnavailable: {unavailable}, resourceQuotas: false, limits: [{{scope: namespace, max: 4}}]}}}}
"""
    return loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + policy)


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "uid": "u-1"},
       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
VIEW = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}],
                                 known=("namespaces", "pods"))


@pytest.fixture
def hanging() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


async def _ledger(port: int) -> AsyncIterator[tuple[Ledger, CollectorRegistry]]:
    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    registry = CollectorRegistry()
    session = ApiSession(configuration)
    async with session.running():
        yield Ledger(LedgerStore(session, LedgerSettings(budget=BUDGET), LedgerMetrics(registry, 90.0))), registry


@pytest.mark.parametrize("where", ["refused", "hanging"])
async def test_the_rule_decides_with_a_clear_message_within_the_budget(where: str, hanging: int) -> None:
    port = free_port() if where == "refused" else hanging
    async for ledger, registry in _ledger(port):
        for unavailable, allowed in (("fail-open", True), ("fail-closed", False)):
            request = replace(Request.for_object(POD), name="p")
            decision = engine.evaluate(_policies(unavailable), request, VIEW, "validate")
            assert decision.allowed and decision.charges  # the view saw room: the ledger decides
            started = time.monotonic()
            settled = await charging.settle(ledger, request, decision)
            assert time.monotonic() - started < BUDGET + 2  # (the budget, not a connection timeout)
            assert settled.allowed is allowed
            texts = [f.text() for f in settled.findings]
            expected = "[caps/quota] Pod ml/p: GPU quota ledger unavailable: "
            assert len(texts) == 1 and texts[0].startswith(expected), texts
            reason = "cannot reach the API server" if where == "refused" else "the ledger was not written within 0.5 s"
            assert reason in texts[0], texts
            assert (texts[0] in settled.warnings) is allowed
        for decision_label in ("fail-open", "fail-closed"):
            value = registry.get_sample_value("gpu_admission_quota_ledger_unavailable_total", {"decision": decision_label})
            assert value == 1.0
        assert registry.get_sample_value("gpu_admission_quota_charges_total", {"outcome": "unavailable"}) == 2.0


async def test_a_pod_the_view_already_refuses_never_reaches_the_ledger() -> None:
    async for ledger, registry in _ledger(free_port()):
        full = SnapshotView.from_objects([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
            {**POD, "metadata": {"name": "big", "namespace": "ml", "uid": "u-0"}, "status": {"phase": "Running"},
             "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}},
        ], known=("namespaces", "pods"))
        request = replace(Request.for_object(POD), name="p")
        decision = engine.evaluate(_policies("fail-open"), request, full, "validate")
        assert not decision.allowed
        assert await charging.settle(ledger, request, decision) is decision
        assert registry.get_sample_value("gpu_admission_quota_charges_total", {"outcome": "unavailable"}) == 0.0
        await asyncio.sleep(0)

"""A ledger write the API server refuses for what it holds fails the caps closed, whatever
clusterUnavailable says (issue #42); an API server that is away or failing still lets the rule decide.

Against the fake API server (tests/fakeapi), which serves GPUQuotaLedgers,
refuses an object past its size limit as kube-apiserver passes etcd's refusal
on (a 500 "etcdserver: request is too large"), and answers any status asked.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fakeapi import FakeApiServer
from tests.support import POLICIES
from webhook.cluster.session import ApiSession
from webhook.ledger.charger import Ledger
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.policy import engine, loader
from webhook.policy.decision import Decision
from webhook.policy.request import Request
from webhook.server import charging
from webhook.view.snapshot import SnapshotView

NAMESPACE = "gpu-admission"
VIEW = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}],
                                 known=("namespaces", "pods"))


def _policies(unavailable: str) -> loader.PolicySet:
    return loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + f"""
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: caps}}
spec:
  rules: {{quota: {{clusterUnavailable: {unavailable}, resourceQuotas: false, limits: [{{scope: namespace, max: 4}}]}}}}
""")


def _pod(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(default_namespaces=("default", NAMESPACE, "ml"), max_object_bytes=1500) as server:
        yield server


async def _ledger(api: FakeApiServer) -> AsyncIterator[tuple[Ledger, CollectorRegistry]]:
    registry = CollectorRegistry()
    session = ApiSession(api.api_client().configuration)
    async with session.running():
        yield Ledger(LedgerStore(session, LedgerSettings(namespace=NAMESPACE, budget=1.0, reserve_max=0),
                                 LedgerMetrics(registry, 90.0))), registry


async def _admit(ledger: Ledger, unavailable: str, name: str, uid: str) -> Decision:
    request = replace(Request.for_object(_pod(name, uid)), name=name)
    decision = engine.evaluate(_policies(unavailable), request, VIEW, "validate")
    assert decision.allowed and decision.charges  # the view has room: the ledger decides
    return await charging.settle(ledger, request, decision)


def _refused(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("gpu_admission_quota_ledger_refused_total", {"reason": reason})


async def test_a_ledger_grown_past_etcds_limit_refuses_every_pod_even_where_the_rule_fails_open(
        api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    async for ledger, registry in _ledger(api):
        # long names (as Kubernetes allows them) until a write is too large for the fake's "etcd"
        decisions = [await _admit(ledger, "fail-open", f"{'p' * 250}-{i}", f"uid-{i}") for i in range(4)]
        assert [d.allowed for d in decisions[:2]] == [True, True]
        refused = [d for d in decisions if not d.allowed]
        assert refused, "the fake's size limit was never reached"
        with caplog.at_level(logging.ERROR):
            last = await _admit(ledger, "fail-open", "p" * 250, "uid-last")
        assert not last.allowed
        (text,) = [f.text() for f in last.findings if f.mode == "enforce"]
        assert text.startswith("[caps/quota] Pod ml/" + "p" * 250 + ": GPU quota ledger refused the charge: "), text
        assert "etcdserver: request is too large" in text and "(GPU caps fail closed)" in text
        assert not last.warnings
        assert _refused(registry, "too-large") == 1 + len(refused)
        assert registry.get_sample_value("gpu_admission_quota_ledger_unavailable_total",
                                         {"decision": "fail-closed"}) == 1 + len(refused)
        assert registry.get_sample_value("gpu_admission_quota_ledger_unavailable_total", {"decision": "fail-open"}) == 0
        assert any("refused (too-large)" in r.getMessage() and "whatever clusterUnavailable says" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(("status", "reason"), [(413, "too-large"), (422, "invalid"), (400, "bad-request"),
                                                (403, "forbidden")])
async def test_a_write_refused_for_its_content_fails_closed_whatever_cluster_unavailable_says(
        api: FakeApiServer, status: int, reason: str) -> None:
    async for ledger, registry in _ledger(api):
        assert (await _admit(ledger, "fail-open", "p0", "uid-0")).allowed  # the ledger exists, and works
        api.fail_next(1, status, path_contains="gpuquotaledgers")
        decision = await _admit(ledger, "fail-open", "p1", "uid-1")
        assert not decision.allowed
        (text,) = [f.text() for f in decision.findings if f.mode == "enforce"]
        assert "GPU quota ledger refused the charge: " in text and f"HTTP {status}" in text, text
        assert _refused(registry, reason) == 1
        # (refused once, not tried again until the budget ran out)
        assert len(api.requests(path_contains="gpuquotaledgers", method="PUT")) == 2
        assert (await _admit(ledger, "fail-open", "p2", "uid-2")).allowed  # the next write is whole again


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_an_api_server_failing_or_busy_still_lets_cluster_unavailable_decide(api: FakeApiServer,
                                                                                 status: int) -> None:
    async for ledger, registry in _ledger(api):
        assert (await _admit(ledger, "fail-open", "p0", "uid-0")).allowed
        api.fail_next(1000, status, path_contains="gpuquotaledgers")
        decision = await _admit(ledger, "fail-open", "p1", "uid-1")
        assert decision.allowed
        assert any("GPU quota ledger unavailable" in w for w in decision.warnings), decision.warnings
        closed = await _admit(ledger, "fail-closed", "p2", "uid-2")
        assert not closed.allowed
        assert all(_refused(registry, r) == 0 for r in ("too-large", "invalid", "bad-request", "forbidden"))
        api.clear_failures()

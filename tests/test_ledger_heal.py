"""Self-healing (issue #41): a stored pod the watch sees holding GPUs with no charge is charged at once.

A pod admitted while the ledger could not be written (fail-open), or before
its caps were enforced, holds GPUs that no charge holds. The pod watch
(``PodFollower``) notes it, and the upkeep's next beat charges it through a
recount of its ledger (a fresh read, written with its precondition): it counts
against the cap from then on, the correction is counted
(``gpu_admission_quota_uncharged_pods_charged_total``) and logged. Against
the fake API server (tests/fakeapi).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Iterator
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fakeapi import FakeApiServer
from tests.support import cap_of_4_policies
from webhook.cluster.session import ApiSession
from webhook.ledger import document
from webhook.ledger.charger import Ledger
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.ledger.upkeep import PodFollower, Upkeep
from webhook.policy.charges import Holding, LedgerKey
from webhook.view.protocol import Object
from webhook.view.snapshot import SnapshotView

NAMESPACE = "gpu-admission"
KEY = LedgerKey("namespace", "ml", "", "nvidia.com/gpu.product")


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
            "status": {"phase": "Running"}}


class _View(SnapshotView):
    """The cluster view as the index answers the upkeep."""

    def pod(self, namespace: str, name: str) -> Object | None:
        return next((p for p in self.pods(namespace) if p["metadata"]["name"] == name), None)

    def namespaces(self) -> Collection[Object]:
        return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(default_namespaces=("default", NAMESPACE, "ml")) as server:
        yield server


async def _upkeep(api: FakeApiServer, view: SnapshotView) -> AsyncIterator[tuple[Upkeep, CollectorRegistry]]:
    policies = cap_of_4_policies()
    registry = CollectorRegistry()
    session = ApiSession(api.api_client().configuration)
    async with session.running():
        store = LedgerStore(session, LedgerSettings(namespace=NAMESPACE, reserve_max=0), LedgerMetrics(registry, 90.0))
        upkeep = Upkeep(Ledger(store), view, lambda: policies)  # type: ignore[arg-type]
        store.seeder = upkeep.seed
        yield upkeep, registry


def _charged(api: FakeApiServer) -> set[str]:
    return set(document.effective(api.objects("GPUQuotaLedger")).get(KEY, {}))


async def test_a_pod_holding_gpus_with_no_charge_is_charged_at_once(
    api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    other = pod("other")
    api.add(document.new_object(KEY, NAMESPACE, {}))
    view = _View.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}, other,
                               pod("admitted-fail-open")], known=("namespaces", "pods"))
    async for upkeep, registry in _upkeep(api, view):
        upkeep.ledger.store.known(api.get("GPUQuotaLedger", document.name_of(KEY), NAMESPACE) or {})
        follower = PodFollower(upkeep)
        upkeep.on_loop = lambda call, *args: call(*args)  # type: ignore[method-assign]  # (this test runs on the loop)
        follower.put(pod("admitted-fail-open"))
        caplog.set_level(logging.WARNING, logger="webhook.ledger.upkeep")
        await upkeep.heal()  # the upkeep's next beat
        assert _charged(api) == {"uid-admitted-fail-open", "uid-other"}
        value = registry.get_sample_value("gpu_admission_quota_uncharged_pods_charged_total")
        assert value == 1.0  # (the other pod was charged by the same recount, but nothing saw it uncharged)
        assert any("ml/admitted-fail-open" in r.getMessage() and "no charge" in r.getMessage()
                   for r in caplog.records)
        # charged now: seen again, nothing more is written
        writes = len(api.requests(method="PUT"))
        follower.put(pod("admitted-fail-open"))
        await upkeep.heal()
        assert len(api.requests(method="PUT")) == writes


async def test_the_watch_thread_leaves_the_loop_alone_for_a_pod_a_ledger_charges(api: FakeApiServer) -> None:
    """Every update of a charged pod (its status, a bind) is one of many: the pod watch's thread checks the
    ledgers known first, and only a pod no ledger charges costs the event loop a call."""
    holding = Holding("ml", "charged", "", None, (("nvidia.com/gpu", Decimal(1)),))
    api.add(document.new_object(KEY, NAMESPACE, {"uid-charged": document.Entry(holding, 0.0)}))
    view = _View.from_objects([pod("charged"), pod("uncharged")], known=("namespaces", "pods"))
    async for upkeep, _ in _upkeep(api, view):
        upkeep.ledger.store.known(api.get("GPUQuotaLedger", document.name_of(KEY), NAMESPACE) or {})
        calls: list[Any] = []
        upkeep.on_loop = lambda call, *args: calls.append(args)  # type: ignore[method-assign]
        follower = PodFollower(upkeep)
        for _ in range(3):
            follower.put(pod("charged"))
        assert calls == []
        follower.put(pod("uncharged"))
        assert [args[0]["metadata"]["uid"] for args in calls] == ["uid-uncharged"]


async def test_the_recount_corrects_a_holding_that_no_longer_says_what_the_pod_holds(api: FakeApiServer) -> None:
    """Issue #41, holdings that follow the pod: a pod charged while scheduling-gated with no model, then
    ungated with a nodeSelector on one (Kueue does this), is counted on that model from the recount on,
    from when it was first charged; the control, a pod whose holding is what it holds, is left as it was."""
    free = Holding("ml", "gated", "", None, (("nvidia.com/gpu", Decimal(1)),))
    kept = Holding("ml", "other", "", None, (("nvidia.com/gpu", Decimal(1)),))
    api.add(document.new_object(KEY, NAMESPACE, {"uid-gated": document.Entry(free, 100.0),
                                                 "uid-other": document.Entry(kept, 200.0)}))
    ungated = pod("gated")
    ungated["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    view = _View.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}, ungated,
                               pod("other")], known=("namespaces", "pods"))
    async for upkeep, registry in _upkeep(api, view):
        upkeep.ledger.store.known(api.get("GPUQuotaLedger", document.name_of(KEY), NAMESPACE) or {})
        await upkeep.recount()
        held = document.effective(api.objects("GPUQuotaLedger"))[KEY]
        assert held["uid-gated"].holding.models == frozenset({"NVIDIA-H100-80GB-HBM3"})
        assert held["uid-gated"].at == 100.0
        assert held["uid-other"] == document.Entry(kept, 200.0)
        assert registry.get_sample_value("gpu_admission_quota_recount_corrections_total",
                                         {"change": "corrected"}) == 1.0
        # corrected: the next recount writes nothing
        writes = len(api.requests(method="PUT"))
        await upkeep.recount()
        assert len(api.requests(method="PUT")) == writes


async def test_a_charged_pod_ungated_with_a_narrower_model_has_its_charge_corrected_at_the_next_beat(
    api: FakeApiServer,
) -> None:
    """The pod watch sees a charged pod's scheduling gates lifted, with a nodeSelector added (Kueue
    ungating a group): the upkeep's next beat recounts its ledger, which corrects its charge, without
    waiting for the periodic recount; an update of a charged pod that was never gated costs nothing."""
    free = Holding("ml", "gated", "", None, (("nvidia.com/gpu", Decimal(1)),))
    api.add(document.new_object(KEY, NAMESPACE, {"uid-gated": document.Entry(free, 100.0)}))
    gated = pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    ungated = pod("gated")
    ungated["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    view = _View.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}, ungated],
                              known=("namespaces", "pods"))
    async for upkeep, _ in _upkeep(api, view):
        upkeep.ledger.store.known(api.get("GPUQuotaLedger", document.name_of(KEY), NAMESPACE) or {})
        upkeep.on_loop = lambda call, *args: call(*args)  # type: ignore[method-assign]  # (this test runs on the loop)
        follower = PodFollower(upkeep)
        follower.put(gated)
        follower.put(gated)  # (another update while gated: nothing)
        writes = len(api.requests(method="PUT"))
        await upkeep.heal()
        assert len(api.requests(method="PUT")) == writes
        follower.put(ungated)
        await upkeep.heal()  # the upkeep's next beat
        held = document.effective(api.objects("GPUQuotaLedger"))[KEY]
        assert held["uid-gated"].holding.models == frozenset({"NVIDIA-H100-80GB-HBM3"})
        assert held["uid-gated"].at == 100.0

"""The ledger itself against a real kube-apiserver: several writers at once, a ledger object deleted, releases.

Ledger instances in this process stand for replicas (each its own session,
its own writers, its own view of the objects); their objects live in a
namespace of their own, which no running ``serve`` watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from tests.e2e.admission import Admission
from tests.e2e.kube import Kube
from webhook.cluster.session import ApiSession
from webhook.ledger import document
from webhook.ledger.charger import Ledger, Settlement
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.policy.charges import CapCheck, Charge, Holding, LedgerKey

MODEL = "nvidia.com/gpu.product"


@pytest.fixture(scope="module")
def namespace(admin: Kube, admission: Admission) -> Iterator[str]:  # (admission: the CRD installed)
    name = f"e2e-ledgers-{uuid.uuid4().hex[:6]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


class Replicas:
    """``count`` ledgers, as ``count`` replicas hold them."""

    def __init__(self, admin: Kube, namespace: str, count: int, budget: float = 3.0) -> None:
        self.admin, self.count = admin, count
        self.settings = LedgerSettings(namespace=namespace, budget=budget)
        self.registries = [CollectorRegistry() for _ in range(count)]
        self.ledgers: list[Ledger] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> list[Ledger]:
        for registry in self.registries:
            session = await self._stack.enter_async_context(ApiSession(self.admin.api.configuration).running())
            self.ledgers.append(Ledger(LedgerStore(session, self.settings, LedgerMetrics(registry, self.settings.window))))
        return self.ledgers

    async def __aexit__(self, *exc: Any) -> None:
        for ledger in self.ledgers:
            await ledger.stop()
        await self._stack.aclose()


def _key() -> LedgerKey:
    return LedgerKey("team", f"t-{uuid.uuid4().hex[:6]}", "team", MODEL)


def _charge(key: LedgerKey, cap: int = 8, gpus: int = 1, namespace: str = "ml-a") -> Charge:
    uid = str(uuid.uuid4())
    check = CapCheck("caps", f"Pod {namespace}/{uid[:8]}", "/spec/containers", "nvidia.com/gpu", "*", (), cap, True)
    return Charge(key, uid, Holding(namespace, uid[:8], "", None, (("nvidia.com/gpu", Decimal(gpus)),)), (check,))


def _stored(admin: Kube, namespace: str, key: LedgerKey) -> dict[str, Any]:
    """What the ledger holds, both its parts read."""
    listed = client.CustomObjectsApi(admin.api).list_namespaced_custom_object(
        document.GROUP, document.VERSION, namespace, document.PLURAL)
    return dict(document.effective(listed["items"]).get(key, {}))  # type: ignore[index]


async def _timed(coroutine: Any) -> tuple[Settlement, float]:
    started = time.monotonic()
    result = await coroutine
    return result, time.monotonic() - started


async def test_twelve_writers_at_once_admit_exactly_the_cap_each_request_decided_within_the_budget(
    admin: Kube, namespace: str
) -> None:
    key = _key()
    replicas = Replicas(admin, namespace, 12, budget=3.0)
    async with replicas as ledgers:
        # every replica reads the ledger first (a dry run's answer comes from a fresh read): all twelve
        # then judge against the same version, and all but one of their first writes must be refused
        for ledger in ledgers:
            assert not (await ledger.settle([_charge(key)], True)).denials
        asks = [(ledger, _charge(key)) for ledger in ledgers for _ in range(8)]  # 96 pods, 8 per replica
        results = await asyncio.gather(*(_timed(ledger.settle([charge], False)) for ledger, charge in asks))
    # they raced: writes refused for another's, judged again
    assert sum(r.get_sample_value("gpu_admission_quota_ledger_conflicts_total") or 0 for r in replicas.registries) > 0
    charged = {c.uid for (_, c), (s, _) in zip(asks, results) if s.charged}
    assert len(charged) == 8
    assert all(not s.unavailable for s, _ in results), [s.unavailable for s, _ in results if s.unavailable][:3]
    assert all(s.denials and "uses 8 of 8" in s.denials[0].message for s, _ in results if not s.charged)
    assert max(seconds for _, seconds in results) < 3.0 + 1.0  # the budget bounds every one
    assert set(_stored(admin, namespace, key)) == charged


async def test_a_dry_run_is_judged_and_writes_nothing(admin: Kube, namespace: str) -> None:
    key = _key()
    async with Replicas(admin, namespace, 1) as (ledger,):
        first = _charge(key, cap=2, gpus=2)
        assert (await ledger.settle([first], False)).charged
        dry = await ledger.settle([_charge(key, cap=2)], True)
        assert not dry.charged and "uses 2 of 2" in dry.denials[0].message
        fits = await ledger.settle([_charge(key, cap=4)], True)
        assert not fits.denials and not fits.charged
    assert set(_stored(admin, namespace, key)) == {first.uid}


async def test_a_deleted_ledger_object_comes_back_with_the_pods_the_view_shows(admin: Kube, namespace: str) -> None:
    key = _key()
    held = {f"running-{i}": Holding("ml-a", f"running-{i}", "", None, (("nvidia.com/gpu", Decimal(1)),))
            for i in range(3)}

    async def seed(asked: LedgerKey) -> dict[str, Holding]:
        assert asked == key
        return held

    async with Replicas(admin, namespace, 1) as (ledger,):
        ledger.store.seeder = seed
        assert (await ledger.settle([_charge(key, cap=4)], False)).charged  # created with the 3, then 1 more
        admin.delete({"apiVersion": document.API_VERSION, "kind": document.KIND,
                      "metadata": {"name": document.name_of(key), "namespace": namespace}})
        # the cached object is gone: the next write finds out, and starts again from the view
        again = await ledger.settle([_charge(key, cap=4)], False)
        assert again.charged
        refused = await ledger.settle([_charge(key, cap=4)], False)
        assert not refused.charged and "uses 4 of 4" in refused.denials[0].message
    assert set(held) <= set(_stored(admin, namespace, key))


async def test_releases_give_gpus_back_to_every_replica(admin: Kube, namespace: str) -> None:
    key = _key()
    async with Replicas(admin, namespace, 2) as (one, two):
        full = _charge(key, cap=1)
        assert (await one.settle([full], False)).charged
        assert not (await two.settle([_charge(key, cap=1)], False)).charged
        one.release([full], "rolled-back")
        for _ in range(100):
            if not _stored(admin, namespace, key):
                break
            await asyncio.sleep(0.05)
        assert (await two.settle([_charge(key, cap=1)], False)).charged  # two's stale copy costs a conflict only
    assert len(_stored(admin, namespace, key)) == 1


async def test_a_charge_written_twice_is_one_charge(admin: Kube, namespace: str) -> None:
    # an answer lost after the write: the same pod comes again, and fits, whatever else was charged since
    key = _key()
    async with Replicas(admin, namespace, 1) as (ledger,):
        mine = _charge(key, cap=2, gpus=2)
        assert (await ledger.settle([mine], False)).charged
        again = await ledger.settle([mine], False)
        assert not again.denials and not again.unavailable
    assert list(_stored(admin, namespace, key)) == [mine.uid]

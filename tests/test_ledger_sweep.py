"""The sweep keeps an overdue charge only for a pod the API server says exists with its uid (issue #42).

A charge whose pod the cluster view has not shown within the window is
read from the API server (the fake, tests/fakeapi): a 404, and also a 400, a
422 or a name no pod can have (a review forged straight to the webhook's
port, ``ghost%zz-…``), release it; a pod that exists with that uid keeps it;
an API server that cannot answer (5xx) delays the release, for
``UNREACHABLE_WINDOWS`` windows at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fakeapi import FakeApiServer
from webhook.cluster.session import ApiSession
from webhook.ledger import document
from webhook.ledger.charger import Ledger
from webhook.ledger.document import Entry
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.ledger.upkeep import UNREACHABLE_WINDOWS, Upkeep
from webhook.policy.charges import Holding, LedgerKey
from webhook.view.protocol import KNOWN, Availability

NAMESPACE = "gpu-admission"
KEY = LedgerKey("namespace", "ml", "", "nvidia.com/gpu.product")
WINDOW = 90.0
START = 1_000_000.0


class _View:
    """A cluster view that has not shown any pod yet (every charge is in flight, then overdue)."""

    def availability(self, resource: str) -> Availability:
        return KNOWN

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(default_namespaces=("default", NAMESPACE, "ml")) as server:
        yield server


async def _upkeep(api: FakeApiServer, clock: list[float]) -> AsyncIterator[Upkeep]:
    session = ApiSession(api.api_client().configuration)
    async with session.running():
        store = LedgerStore(session, LedgerSettings(namespace=NAMESPACE, window=WINDOW, reserve_max=0),
                            LedgerMetrics(CollectorRegistry(), WINDOW), clock=lambda: clock[0])
        yield Upkeep(Ledger(store), _View(), lambda: None)  # type: ignore[arg-type, return-value]


def _entry(name: str) -> Entry:
    return Entry(Holding("ml", name, "", None, (("nvidia.com/gpu", Decimal(1)),)), START)


def _charged(api: FakeApiServer) -> set[str]:
    return set(document.effective(api.objects("GPUQuotaLedger")).get(KEY, {}))


async def _sweep(upkeep: Upkeep, api: FakeApiServer, expected: set[str]) -> set[str]:
    """Sweep, and what the ledger holds once its releases are written (or after a while)."""
    await upkeep.sweep()
    for _ in range(100):
        if _charged(api) == expected:
            break
        await asyncio.sleep(0.02)
    return _charged(api)


async def test_only_a_pod_seen_to_exist_keeps_its_charge_past_the_window(api: FakeApiServer) -> None:
    live = api.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "live", "namespace": "ml"},
                    "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}})
    api.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "renamed", "namespace": "ml"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}})
    charges = {
        live["metadata"]["uid"]: _entry("live"),  # exists with this uid: kept
        "uid-another": _entry("renamed"),  # a pod by that name, with another uid: released
        "uid-gone": _entry("gone"),  # 404: released
        "uid-400": _entry("bad-request"),  # 400: released (it kept the charge)
        "uid-422": _entry("invalid"),  # 422: released (it kept the charge)
        "uid-ghost": _entry("ghost%zz-0d6c5f0e"),  # a name no pod can have: released without a read
        "uid-away": _entry("away"),  # the API server cannot say (503): kept, for a while
    }
    api.fail_next(1, 400, path_contains="/pods/bad-request")
    api.fail_next(1, 422, path_contains="/pods/invalid")
    api.fail_next(10_000, 503, path_contains="/pods/away")
    clock = [START + WINDOW + 1]
    async for upkeep in _upkeep(api, clock):
        upkeep.ledger.store.known(api.add(document.new_object(KEY, NAMESPACE, charges)))
        kept = {live["metadata"]["uid"], "uid-away"}
        assert await _sweep(upkeep, api, kept) == kept
        assert not api.requests(path_contains="ghost")  # (nothing to read: no pod can have that name)
        # an API server that cannot say keeps the charge, but not for ever
        clock[0] = START + (UNREACHABLE_WINDOWS - 0.5) * WINDOW
        assert await _sweep(upkeep, api, kept) == kept
        clock[0] = START + UNREACHABLE_WINDOWS * WINDOW
        assert await _sweep(upkeep, api, {live["metadata"]["uid"]}) == {live["metadata"]["uid"]}
        api.clear_failures()

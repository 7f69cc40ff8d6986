"""Reads never block on a relist; stop() is prompt; metrics tell the truth."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from tests.fakeapi import FakeApiServer
from webhook.cluster import Backoff, ClusterIndex
from webhook.view.protocol import KNOWN, RESOURCES

from . import builders
from .conftest import FAST, MakeIndex
from .polling import ManualClock, eventually

PODS = 20_000


async def test_reads_do_not_wait_for_a_relist(api: FakeApiServer, make_index: MakeIndex) -> None:
    namespaces = [f"team-{i}" for i in range(50)]
    api.add_many(builders.namespace(ns) for ns in namespaces)
    api.add_many(builders.node(f"gpu-{i}") for i in range(20))
    api.add_many(builders.pod(f"p{i}", namespaces[i % 50]) for i in range(PODS))
    # The fake's 20k full pods share this process (they would not in production);
    # keep the cyclic GC from walking them again and again, which only slows the test.
    gc.freeze()
    try:
        await _relist_while_reading(api, await make_index(resources=["namespaces", "nodes", "pods"]))
    finally:
        gc.unfreeze()


async def _relist_while_reading(api: FakeApiServer, index: ClusterIndex) -> None:
    assert await index.wait_synced(30)
    await eventually(lambda: api.open_watches("Pod") == 1, what="pod watch open")
    assert len(index.pods()) == PODS

    api.expire_watches()  # every watch gets 410: a full relist of 20k pods
    began = time.perf_counter()
    slowest, reads, sizes = 0.0, 0, set()
    while index.state("pods").relists < 1:
        start = time.perf_counter()
        found = index.namespace("team-7")
        nodes = len(index.nodes())
        team = sum(1 for _ in index.pods("team-7"))
        total = len(index.pods())
        index.availability("pods")
        slowest = max(slowest, time.perf_counter() - start)
        reads += 1
        sizes.add((found is not None, nodes, team, total))
        assert time.perf_counter() - began < 60, "relist did not finish"
        time.sleep(0)  # let other threads in, as an event loop between requests would
    relist = time.perf_counter() - began

    # Every read saw a complete state (old or new, never a half-built one) ...
    assert sizes == {(True, 20, PODS // 50, PODS)}
    # ... and none waited for the relist: a generous bound, relative to the relist itself.
    assert reads > 10
    assert slowest < 0.1 * relist, f"slowest read {slowest:.4f}s vs relist {relist:.3f}s"


async def test_stop_is_prompt_even_mid_watch_and_mid_backoff(api: FakeApiServer, make_index: MakeIndex) -> None:
    slow = dataclasses.replace(FAST, watch_timeout=300, backoff=Backoff(initial=60, cap=60))
    watching = await make_index(settings=slow)
    assert await watching.wait_synced(5)
    await eventually(lambda: api.open_watches() == len(RESOURCES), what="a watch open per resource")
    api.fail_next(10_000, path_contains="/api/v1/nodes")
    backing_off = await make_index(resources=["nodes"], settings=slow)
    await eventually(lambda: backing_off.state("nodes").watch_errors == 1, what="in a 60 s backoff")

    start = time.monotonic()
    await watching.stop()
    await backing_off.stop()
    assert time.monotonic() - start < 2.0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("watch-")]
    await eventually(lambda: api.open_watches() == 0, what="server saw the watches close")


async def test_stop_before_start_and_twice(make_index: MakeIndex) -> None:
    index = await make_index(start=False)
    await index.stop()
    await index.stop()


async def test_metrics_on_the_given_registry_only(api: FakeApiServer, make_index: MakeIndex) -> None:
    registry = CollectorRegistry()
    clock = ManualClock()
    api.add_many(builders.pod(f"p{i}", gpus=i % 2) for i in range(6))
    api.add(builders.node("gpu-1"))
    index = await make_index(resources=["pods", "nodes"], registry=registry, clock=clock)

    def sample(name: str, resource: str) -> float | None:
        return registry.get_sample_value(f"gpu_admission_cluster_{name}", {"resource": resource})

    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches() == 2, what="watches open")
    assert sample("synced", "pods") == 1 and sample("objects", "pods") == 3 and sample("objects", "nodes") == 1
    assert sample("relists_total", "pods") == 0 and sample("watch_errors_total", "nodes") == 0
    clock.advance(7)
    assert sample("last_event_age_seconds", "pods") == 7
    api.drop_watches()
    await eventually(lambda: sample("watch_errors_total", "pods") == 1, what="drop counted")
    await eventually(lambda: api.open_watches() == 2, what="watches reopened")
    api.expire_watches()
    await eventually(lambda: sample("relists_total", "nodes") == 1, what="relist counted")
    assert sample("last_event_age_seconds", "nodes") == 0
    assert sample("synced", "runtimeclasses") is None  # not watched, not exported
    assert prometheus_client.REGISTRY.get_sample_value("gpu_admission_cluster_synced", {"resource": "pods"}) is None
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        ClusterIndex(api.api_client(), registry=registry)


async def test_synced_gauge_is_zero_until_the_first_list(api: FakeApiServer, make_index: MakeIndex) -> None:
    registry = CollectorRegistry()
    api.fail_next(10_000, path_contains="/api/v1/namespaces")
    index = await make_index(resources=["namespaces"], registry=registry)
    await eventually(lambda: index.state("namespaces").watch_errors >= 1, what="failing list")
    assert registry.get_sample_value("gpu_admission_cluster_synced", {"resource": "namespaces"}) == 0
    assert registry.get_sample_value("gpu_admission_cluster_objects", {"resource": "namespaces"}) == 0
    api.clear_failures()
    assert await index.wait_synced(5) and index.availability("namespaces") == KNOWN
    assert registry.get_sample_value("gpu_admission_cluster_synced", {"resource": "namespaces"}) == 1

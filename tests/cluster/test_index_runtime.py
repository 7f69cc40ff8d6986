"""Reads never block on a relist; stop() is prompt; metrics tell the truth."""

from __future__ import annotations

import asyncio
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
    complete = {(True, 20, PODS // 50, PODS)}
    assert _reads(index, 1) == complete

    # every watch gets 410: a full relist of 20k pods, held by the API server at its second page
    held = api.hold("/api/v1/pods", query_key="continue")
    api.expire_watches()
    await eventually(held.reached.is_set, timeout=30, what="the relist under way, at its second page")
    try:
        # reads answer while the relist cannot finish (one that waited for it would wait for ever:
        # 30 s is only how long this test gives it), from the complete state they had
        try:
            seen = await asyncio.wait_for(asyncio.to_thread(_reads, index, 100), 30)
        except TimeoutError:
            raise AssertionError("a read waited for the relist") from None
        assert index.state("pods").relists == 0, "the relist went on while held"
    finally:
        held.release.set()
    assert seen == complete

    # Every read while the relist runs to its end saw a complete state (old or new, never half-built)
    sizes, began = set(), time.monotonic()
    while index.state("pods").relists < 1:
        sizes |= _reads(index, 1)
        assert time.monotonic() - began < 60, "relist did not finish"
        time.sleep(0)  # let other threads in, as an event loop between requests would
    assert sizes <= complete and _reads(index, 1) == complete


def _reads(index: ClusterIndex, times: int) -> set[tuple[bool, int, int, int]]:
    """What ``times`` rounds of reads saw: (namespace found, nodes, pods of one team, pods)."""
    seen = set()
    for _ in range(times):
        found = index.namespace("team-7")
        nodes = len(index.nodes())
        team = sum(1 for _ in index.pods("team-7"))
        total = len(index.pods())
        index.availability("pods")
        seen.add((found is not None, nodes, team, total))
    return seen


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
    # far below the 60 s backoff and the 300 s watch it would otherwise wait for, on any machine
    assert time.monotonic() - start < 20.0
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

"""The index recovers from what real API servers do: drops, 5xx, 410 Gone, timeouts."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from tests.fakeapi import FakeApiServer
from webhook.cluster import Backoff
from webhook.view.protocol import KNOWN, Availability

from . import builders
from .builders import names as _names
from .conftest import FAST, MakeIndex
from .polling import ManualClock, eventually


def _pod_watches(api: FakeApiServer) -> list[dict[str, str]]:
    return [r.query for r in api.requests(path_contains="/api/v1/pods", watch=True)]


@dataclass(frozen=True)
class RecordingBackoff(Backoff):
    """A fast backoff that remembers which attempts it was asked about."""

    attempts: list[int] = field(default_factory=list, compare=False)

    def delay(self, attempt: int, rng: random.Random) -> float:
        self.attempts.append(attempt)
        return super().delay(attempt, rng)


async def test_dropped_watch_resumes_from_last_version_without_relist(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    api.add(builders.pod("a"))
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Pod") == 1, what="pod watch open")
    before = index.resource_version("pods")
    api.drop_watches()
    api.delete("Pod", "a", "default")
    api.add(builders.pod("b"))
    await eventually(lambda: _names(index.pods()) == {"b"}, what="changes made while dropped")
    watches = _pod_watches(api)
    assert len(watches) == 2 and watches[1]["resourceVersion"] == before
    state = index.state("pods")
    assert state.relists == 0 and state.watch_errors == 1
    assert index.availability("pods") == KNOWN


async def test_server_errors_back_off_then_recover(api: FakeApiServer, make_index: MakeIndex) -> None:
    backoff = RecordingBackoff(initial=0.01, cap=0.04)
    api.fail_next(3, status=500, path_contains="/api/v1/pods")
    api.add(builders.pod("a"))
    index = await make_index(resources=["pods"], settings=dataclasses.replace(FAST, backoff=backoff))
    assert await index.wait_synced(5)
    assert [r.status for r in api.requests(path_contains="/api/v1/pods", watch=False)] == [500, 500, 500, 200]
    assert backoff.attempts == [0, 1, 2]  # exponential: each failure waits longer, up to the cap
    assert index.state("pods").watch_errors == 3 and index.state("pods").error == ""
    assert _names(index.pods()) == {"a"}
    api.add(builders.pod("b"))
    await eventually(lambda: len(index.pods()) == 2, what="watch working after recovery")


async def test_not_synced_reason_names_the_failure(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.fail_next(10_000, status=403, path_contains="/api/v1/nodes")
    index = await make_index(resources=["nodes"])
    await eventually(lambda: index.state("nodes").watch_errors >= 2, what="list failures")
    assert index.availability("nodes") == Availability(False, "nodes not synced yet: list failing (HTTP 403)")
    api.clear_failures()
    assert await index.wait_synced(5)
    assert index.availability("nodes") == KNOWN


async def test_http_410_on_watch_start_relists(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.pod("a"))
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Pod") == 1, what="pod watch open")
    api.fail_next(1, status=410, path_contains="/api/v1/pods", watch=True)
    api.drop_watches()
    await eventually(lambda: index.state("pods").relists == 1, what="relist")
    assert [r.status for r in api.requests(path_contains="/api/v1/pods", watch=True)][:2] == [200, 410]
    assert len(api.requests(path_contains="/api/v1/pods", watch=False)) == 2
    assert index.state("pods").watch_errors == 1  # the drop; a 410 is not an error
    assert _names(index.pods()) == {"a"}


async def test_watches_that_keep_expiring_relist_with_backoff(api: FakeApiServer, make_index: MakeIndex) -> None:
    backoff = RecordingBackoff(initial=0.01, cap=0.04)
    index = await make_index(resources=["pods"], settings=dataclasses.replace(FAST, backoff=backoff))
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Pod") == 1, what="pod watch open")
    api.fail_next(3, status=410, path_contains="/api/v1/pods", watch=True)
    api.drop_watches()
    await eventually(lambda: index.state("pods").relists == 3, what="three relists")
    # The drop waits once (attempt 0); the first 410 relists at once; the next two back off.
    assert backoff.attempts == [0, 0, 1]
    assert index.state("pods").watch_errors == 1
    api.add(builders.pod("a"))
    await eventually(lambda: _names(index.pods()) == {"a"}, what="watching again")


async def test_expired_watch_relists_and_forgets_objects_deleted_meanwhile(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    api.add_many(builders.pod(f"p{i}") for i in range(5))
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    stale_rv = index.resource_version("pods")
    api.fail_next(10_000, status=503, path_contains="/api/v1/pods", watch=True)
    api.drop_watches()
    await eventually(lambda: index.state("pods").watch_errors >= 2, what="watch failing")
    api.delete("Pod", "p0", "default")
    api.delete("Pod", "p1", "default")
    api.modify(builders.pod("p2", phase="Failed"))
    api.add(builders.pod("new"))
    api.compact()  # the DELETED events are gone from history: only a relist can tell
    api.clear_failures()
    await eventually(lambda: index.state("pods").relists == 1, what="relist after 410")
    assert _names(index.pods()) == {"p2", "p3", "p4", "new"}
    assert [p["status"]["phase"] for p in index.pods() if p["metadata"]["name"] == "p2"] == ["Failed"]
    expired = [r for r in api.requests(path_contains="/api/v1/pods", watch=True)
               if r.query.get("resourceVersion") == stale_rv and r.status == 200]  # fmt: skip
    assert expired, "the 410 must have come as an ERROR event in a 200 stream"
    assert index.state("pods").error == "" and index.availability("pods") == KNOWN


async def test_expired_error_event_on_an_open_watch_relists(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.node("n1"))
    index = await make_index(resources=["nodes"])
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Node") == 1, what="node watch open")
    api.expire_watches()
    await eventually(lambda: index.state("nodes").relists == 1, what="relist")
    assert index.state("nodes").watch_errors == 0 and _names(index.nodes()) == {"n1"}


async def test_other_error_events_reconnect_from_the_same_version(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    index = await make_index(resources=["namespaces"])
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Namespace") == 1, what="namespace watch open")
    resume = index.resource_version("namespaces")
    api.error_watches(500)
    await eventually(lambda: len(api.requests(path_contains="/namespaces", watch=True)) == 2, what="rewatch")
    assert api.requests(path_contains="/namespaces", watch=True)[1].query["resourceVersion"] == resume
    assert index.state("namespaces").watch_errors == 1 and index.state("namespaces").relists == 0


async def test_bookmarks_advance_the_resume_point(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add(builders.pod("a"))
    index = await make_index(resources=["pods"])
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Pod") == 1, what="pod watch open")
    assert _pod_watches(api)[0]["allowWatchBookmarks"] == "true"
    before = index.resource_version("pods")
    for i in range(5):
        api.add(builders.namespace(f"other-{i}"))  # moves the global resourceVersion, not the pods
    bookmark = api.send_bookmark()
    assert int(bookmark) == int(before or 0) + 5
    await eventually(lambda: index.resource_version("pods") == bookmark, what="bookmark applied")
    assert _names(index.pods()) == {"a"}
    api.compact()  # without the bookmark the resumed watch would be too old
    api.drop_watches()
    await eventually(lambda: len(_pod_watches(api)) == 2, what="resumed watch")
    assert _pod_watches(api)[1]["resourceVersion"] == bookmark
    api.add(builders.pod("b"))
    await eventually(lambda: _names(index.pods()) == {"a", "b"}, what="watch after bookmark")
    assert index.state("pods").relists == 0


async def test_watches_are_cycled_by_server_timeout(api: FakeApiServer, make_index: MakeIndex) -> None:
    index = await make_index(resources=["runtimeclasses"], settings=dataclasses.replace(FAST, watch_timeout=1))
    assert await index.wait_synced(5)
    path = "/apis/node.k8s.io/v1/runtimeclasses"
    await eventually(lambda: len(api.requests(path_contains=path, watch=True)) >= 2, timeout=10, what="cycle")
    first, second = (r.query for r in api.requests(path_contains=path, watch=True)[:2])
    assert first["timeoutSeconds"] == second["timeoutSeconds"] == "1"
    assert first["resourceVersion"] == second["resourceVersion"]
    assert index.state("runtimeclasses").watch_errors == 0 and index.state("runtimeclasses").relists == 0
    api.add(builders.runtime_class("nvidia"))
    await eventually(lambda: index.runtime_class("nvidia") is not None, what="event after cycling")


async def watched_nodes(api: FakeApiServer, make_index: MakeIndex) -> tuple[Any, ManualClock]:
    """An index of nodes on a manual clock, synced, its watch open, stale after 30 s."""
    clock = ManualClock()
    index = await make_index(resources=["nodes"], clock=clock, settings=dataclasses.replace(FAST, stale_after=30))
    assert await index.wait_synced(5)
    await eventually(lambda: api.open_watches("Node") == 1, what="node watch open")
    return index, clock


async def test_stale_when_the_watch_fails_longer_than_the_window(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    index, clock = await watched_nodes(api, make_index)
    api.fail_next(10_000, status=500, path_contains="/api/v1/nodes", watch=True)
    api.drop_watches()
    await eventually(lambda: index.state("nodes").error == "watch failing (HTTP 500)", what="failing watch")
    clock.advance(29)
    assert index.availability("nodes") == KNOWN  # a short outage is tolerated
    clock.advance(16)
    assert index.availability("nodes") == Availability(False, "nodes stale for 45s: watch failing (HTTP 500)")
    assert index.synced()  # readiness is about the first sync; staleness is the rules' call
    api.clear_failures()
    await eventually(lambda: index.availability("nodes") == KNOWN, what="fresh again")


async def test_a_long_quiet_watch_is_not_stale_the_moment_it_breaks(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    index, clock = await watched_nodes(api, make_index)
    clock.advance(100)  # a healthy watch with nothing to say
    api.add(builders.node("n1"))
    await eventually(lambda: len(index.nodes()) == 1, what="an event")
    clock.advance(100)  # quiet again
    api.fail_next(10_000, status=500, path_contains="/api/v1/nodes", watch=True)
    api.drop_watches()
    await eventually(lambda: index.state("nodes").error == "watch failing (HTTP 500)", what="failing watch")
    assert index.availability("nodes") == KNOWN  # alive until the drop: the outage has just begun
    clock.advance(31)
    assert index.availability("nodes") == Availability(False, "nodes stale for 31s: watch failing (HTTP 500)")

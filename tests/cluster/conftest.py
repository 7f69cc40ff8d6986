from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from tests.fakeapi import FakeApiServer
from webhook.cluster import Backoff, ClusterIndex, WatchSettings

#: Fast enough for tests: failures are retried after 10-50 ms.
FAST = WatchSettings(watch_timeout=30, backoff=Backoff(initial=0.01, cap=0.05), stale_after=30)

MakeIndex = Callable[..., Awaitable[ClusterIndex]]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def make_index(api: FakeApiServer) -> AsyncIterator[MakeIndex]:
    """Build and start indexes against the fake; all are stopped at teardown."""
    made: list[ClusterIndex] = []

    async def make(*, start: bool = True, **options: Any) -> ClusterIndex:
        options.setdefault("settings", FAST)
        index = ClusterIndex(api.api_client(), **options)
        made.append(index)
        if start:
            await index.start()
        return index

    yield make
    for index in made:
        await index.stop()

"""Open watches: who is watching what, and how events reach the connection.

A :class:`Watcher` is registered in the store while its watch is open; the
store queues events for it from any thread, and :func:`pump` writes them to
the chunked response as JSON lines on the server's loop. The :data:`DROP`
and :data:`CLOSE` sentinels end a stream by aborting the connection or
cleanly.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakeapi.resources import Obj, ResourceType
from tests.fakeapi.selector import Selector

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
DROP = object()  # queue sentinel: abort the connection mid-stream
CLOSE = object()  # queue sentinel: end the stream cleanly


@dataclass(eq=False)
class Watcher:
    """One open watch: the resource, namespace and selector it follows."""

    rt: ResourceType
    namespace: str | None
    selector: Selector
    bookmarks: bool
    loop: asyncio.AbstractEventLoop
    since: int = 0  # the resourceVersion the watch started from
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def visible(self, obj: Obj) -> bool:
        """Whether an object of the watched resource is in this watch's namespace and selection."""
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.selector.matches(obj)


async def pump(watcher: Watcher, request: web.Request, response: web.StreamResponse, timeout: float) -> bool:
    """Stream queued events until timeout; False when the connection must be aborted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while request.transport is not None and not request.transport.is_closing():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return True
        try:
            # Wake up now and then: aiohttp does not cancel a handler whose client left.
            item = await asyncio.wait_for(watcher.queue.get(), min(remaining, 0.05))
        except TimeoutError:
            continue
        if item is DROP:
            return False
        if item is CLOSE:
            return True
        await response.write(json.dumps(item).encode() + b"\n")
        if item["type"] == "ERROR":
            return True
    return True

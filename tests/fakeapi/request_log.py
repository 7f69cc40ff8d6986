"""The request log and scheduled failures, for assertions and fault injection.

Every request the fake receives is recorded as a :class:`RequestRecord`
before it is handled; :meth:`RequestLog.receive` also says whether a failure
scheduled with ``fail_next`` must answer it instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class RequestRecord:
    """One request the fake received, for assertions."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int | None = None

    @property
    def watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


# Typed request storage where aiohttp has it (3.13+), a plain key on older versions.
RECORD: Any = web.RequestKey("record", RequestRecord) if hasattr(web, "RequestKey") else "record"


@dataclass
class Failure:
    """A failure ``fail_next`` scheduled: ``remaining`` more matching requests get ``code``."""

    remaining: int
    code: int
    path_contains: str | None
    watch: bool | None


@dataclass
class Hold:
    """The next request to a path containing ``path_contains`` whose query has ``query_key``,
    kept unanswered from ``reached`` on until ``release`` is set (``FakeApiServer.hold``)."""

    path_contains: str
    query_key: str
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class RequestLog:
    """What the fake received and what it must fail, guarded by the server's lock."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._records: list[RequestRecord] = []
        self._failures: list[Failure] = []
        self._holds: list[Hold] = []

    def receive(self, record: RequestRecord) -> int | None:
        """Log a request; the status code it must fail with, if a failure is due."""
        with self._lock:
            self._records.append(record)
            return self._take_failure(record)

    def _take_failure(self, record: RequestRecord) -> int | None:
        for failure in self._failures:
            if failure.remaining > 0 and (failure.watch is None or failure.watch == record.watch) and (
                failure.path_contains is None or failure.path_contains in record.path
            ):
                failure.remaining -= 1
                return failure.code
        return None

    def take_hold(self, record: RequestRecord) -> Hold | None:
        """The hold that ``record`` is the request of, if any (each holds one request)."""
        with self._lock:
            for hold in self._holds:
                if hold.path_contains in record.path and hold.query_key in record.query:
                    self._holds.remove(hold)
                    return hold
            return None

    def add_hold(self, hold: Hold) -> None:
        with self._lock:
            self._holds.append(hold)

    def schedule(self, failure: Failure) -> None:
        with self._lock:
            self._failures.append(failure)

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def select(
        self, *, path_contains: str | None = None, watch: bool | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        """The logged requests that match every filter given."""
        with self._lock:
            return [
                r
                for r in self._records
                if (path_contains is None or path_contains in r.path)
                and (watch is None or r.watch == watch)
                and (method is None or r.method == method)
            ]


def iter_requests(records: Iterable[RequestRecord], param: str) -> Iterator[str]:
    """The values one query parameter took across requests (absent ones skipped)."""
    return (r.query[param] for r in records if param in r.query)

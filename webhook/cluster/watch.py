"""List, then watch, one resource in a thread of its own (client-go's reflector).

The loop: list in pages (``limit``/``continue``) into a fresh store and note
the list's resourceVersion; watch from it with bookmarks allowed and a
server-side ``timeoutSeconds`` so that watches are cycled; resume each new
watch from the last resourceVersion seen (object or BOOKMARK). ``410 Gone``
(an HTTP status or an ERROR event) means the server forgot that version:
list again and replace the whole store. Other failures (5xx, dropped
connections, timeouts) are retried with capped, jittered exponential backoff.

The ``kubernetes`` client is blocking, hence a thread. ``stop()`` must not
wait for a watch to time out: it shuts down the socket of the response the
thread is reading, which makes the blocked read return at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from webhook.cluster.backoff import Backoff
from webhook.cluster.kinds import Kind, Shaper
from webhook.cluster.pods import Raw
from webhook.cluster.state import ResourceState
from webhook.cluster.store import Listener, Store, key_of

log = logging.getLogger(__name__)

# What talking to an API server can raise; anything else is a bug, logged with a traceback.
_EXPECTED = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


@dataclass(frozen=True)
class WatchSettings:
    """Tuning shared by all watches of an index."""

    page_size: int = 500  # list ``limit``
    watch_timeout: int = 300  # server-side ``timeoutSeconds``: a watch is cycled this often
    connect_timeout: float = 5.0
    read_timeout: float = 60.0  # a list page; a watch gets watch_timeout on top
    stale_after: float = 60.0  # failing for longer than this: the resource is unknown
    backoff: Backoff = field(default_factory=Backoff)


class _Expired(Exception):
    """The server no longer has our resourceVersion (410 Gone): relist."""


class _Stopped(Exception):
    """stop() was called while a request was being set up."""


class StreamError(Exception):
    """A watch stream carried an ERROR event other than 410."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        super().__init__(str(status.get("message") or status.get("reason") or "watch error"))
        self.code = status.get("code")


def describe(exc: BaseException) -> str:
    """A short reason for messages and logs: "HTTP 500", "connection dropped" ..."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}" if exc.status else f"cannot connect: {exc.reason}"
    if isinstance(exc, StreamError):
        return f"HTTP {exc.code}" if exc.code else f"watch error: {exc}"
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return f"cannot connect: {type(exc.reason).__name__}"
    if isinstance(exc, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return "timed out"
    if isinstance(exc, (urllib3.exceptions.ProtocolError, ConnectionError)):
        return "connection dropped"
    if isinstance(exc, ValueError):
        return "invalid response"
    return type(exc).__name__


def _detail(exc: BaseException) -> str:
    """One line for the log: the Status message of an API error, else the exception text."""
    if isinstance(exc, ApiException):
        try:
            return str(json.loads(exc.body or "")["message"])
        except (ValueError, KeyError, TypeError):
            return str(exc.reason)
    return str(exc)


class ResourceWatch:
    """Keeps ``store`` equal to the server's objects of one kind, and ``state`` honest."""

    def __init__(
        self,
        kind: Kind,
        lister: Callable[..., Any],
        shape: Shaper,
        settings: WatchSettings,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        listener: Listener | None = None,
    ) -> None:
        self.kind = kind
        self.store = Store(listener)
        self.state = ResourceState()
        self._lister = lister
        self._shape = shape
        self._settings = settings
        self._clock = clock
        self._rng = rng
        self._rv: str | None = None  # None: the next step is a (re)list
        self._failures = 0  # consecutive, for the backoff
        self._expiries = 0  # 410s in a row with no event in between
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards _response between the thread and stop()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind.resource}", daemon=True)

    @property
    def resource_version(self) -> str | None:
        """Where the next watch resumes; None while a relist is due."""
        return self._rv

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and interrupt its blocking read; does not wait."""
        self._stopping.set()
        with self._lock:
            if self._response is not None:
                _interrupt(self._response)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._rv is None:
                    self._relist()
                self._watch()
            except _Stopped:
                break
            except _Expired:
                self._expired()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                if self._stopping.is_set():
                    break
                if self._rv is not None and isinstance(exc, ApiException) and exc.status == 410:
                    self._expired()
                    continue
                self._failed(exc)
                self._stopping.wait(self._settings.backoff.delay(self._failures - 1, self._rng))

    def _expired(self) -> None:
        """Relist: at once the first time, after a backoff if watches keep expiring unused."""
        self._rv = None
        self._expiries += 1
        if self._expiries > 1:
            # A server that expires every fresh watch must not get a full list in a tight loop.
            self._stopping.wait(self._settings.backoff.delay(self._expiries - 2, self._rng))

    def _failed(self, exc: Exception) -> None:
        phase = "list" if self._rv is None else "watch"
        reason = describe(exc)
        if isinstance(exc, _EXPECTED + (StreamError,)):
            log.warning("%s %s failing: %s (%s)", self.kind.resource, phase, reason, _detail(exc))
        else:
            log.exception("%s %s failed unexpectedly", self.kind.resource, phase)
        self._failures += 1
        self._update(error=f"{phase} failing ({reason})", watch_errors=self.state.watch_errors + 1)

    def _update(self, **changes: Any) -> None:
        # Only this thread writes the state; readers see the old or the new one.
        self.state = dataclasses.replace(self.state, **changes)

    def _relist(self) -> None:
        objects: list[Raw] = []
        token: str | None = None
        while True:
            page = self._list_page(token)
            self._update(last_event=self._clock())
            for item in page.get("items") or ():
                shaped = self._shape(item)
                if shaped is not None:
                    objects.append(shaped)
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        if not meta.get("resourceVersion"):
            raise ValueError("list response without metadata.resourceVersion")
        self.store.replace(objects)
        self._rv = str(meta["resourceVersion"])
        self._failures = 0
        now, old = self._clock(), self.state
        self._update(synced=True, relists=old.relists + (1 if old.synced else 0), error="",
                     last_success=now, last_event=now)  # fmt: skip

    def _list_page(self, token: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"limit": self._settings.page_size}
        if token:
            options["_continue"] = token
        response = self._lister(
            **options,
            _preload_content=False,
            _request_timeout=(self._settings.connect_timeout, self._settings.read_timeout),
        )
        with self._holding(response):
            page = orjson.loads(response.data)  # several times faster than json on a 100k-pod list
        if not isinstance(page, dict):
            raise ValueError("list response is not a JSON object")
        return page

    def _watch(self) -> None:
        timeout = self._settings.watch_timeout
        response = self._lister(
            watch=True,
            resource_version=self._rv,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(self._settings.connect_timeout, timeout + self._settings.read_timeout),
        )
        with self._holding(response):
            # The server accepted our resourceVersion: what we hold is current.
            self._update(error="", last_success=self._clock())
            try:
                for line in iter_resp_lines(response):
                    if line.strip():
                        self._apply(orjson.loads(line))
            except (urllib3.exceptions.ProtocolError, StreamError):
                # The stream was alive until it broke, just now; a read timeout proves nothing.
                self._update(last_success=self._clock())
                raise
        self._failures = 0
        self._update(last_success=self._clock())

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise StreamError(obj)
        if kind in ("ADDED", "MODIFIED"):
            key = key_of(obj)
            shaped = self._shape(obj)
            if shaped is None:
                self.store.discard(*key)  # e.g. a pod that no longer requests GPUs
            else:
                self.store.put(shaped)
        elif kind == "DELETED":
            self.store.discard(*key_of(obj))
        elif kind != "BOOKMARK":
            raise ValueError(f"unknown watch event type {kind!r}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._rv = str(rv)
        self._failures = self._expiries = 0
        now = self._clock()
        self._update(last_event=now, last_success=now)

    @contextmanager
    def _holding(self, response: Any) -> Iterator[None]:
        """Expose ``response`` to stop() while it is read; close it unless fully read."""
        with self._lock:
            if self._stopping.is_set():
                response.close()
                raise _Stopped()
            self._response = response
        try:
            yield
        except BaseException:
            response.close()
            raise
        else:
            response.release_conn()
        finally:
            with self._lock:
                self._response = None


def _interrupt(response: Any) -> None:
    """Make a read blocked on ``response`` return now, from another thread."""
    try:
        response.shutdown()  # urllib3 >= 2.3
        return
    except (AttributeError, ValueError, RuntimeError, OSError):
        pass
    connection = getattr(response, "connection", None) or getattr(response, "_connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

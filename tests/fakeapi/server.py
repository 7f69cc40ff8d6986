"""The fake kube-apiserver itself: its lifecycle and the controls tests drive it with.

:class:`FakeApiServer` serves the :mod:`~tests.fakeapi.handlers` over its
:mod:`~tests.fakeapi.store` on an event loop in a thread of its own. Every
control method takes the store's lock, so the test thread and asyncio
tests can call them while clients are connected.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from tests.fakeapi import resources
from tests.fakeapi.handlers import Handlers
from tests.fakeapi.request_log import Failure, Hold, RequestLog, RequestRecord
from tests.fakeapi.resources import DEFAULT_NAMESPACES, Obj, ResourceType
from tests.fakeapi.status import status_object
from tests.fakeapi.store import Store
from tests.fakeapi.watch import CLOSE, DROP


class FakeApiServer:
    """The fake kube-apiserver. Use as a context manager, or ``start()``/``stop()``."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        history_limit: int = 200_000,
        default_namespaces: Iterable[str] = DEFAULT_NAMESPACES,
        max_object_bytes: int | None = None,
    ) -> None:
        self._ssl = ssl_context
        self._store = Store(history_limit, max_object_bytes)
        self._log = RequestLog(self._store.lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        for name in default_namespaces:
            self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the base URL."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fakeapi", daemon=True)
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        self.url = f"{'https' if self._ssl else 'http'}://127.0.0.1:{port}"
        return self.url

    async def _serve(self) -> int:
        app = Handlers(self._store, self._log).application()
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock, ssl_context=self._ssl).start()
        return int(sock.getsockname()[1])

    def stop(self) -> None:
        """End open watches cleanly, stop serving and join the thread."""
        if self._loop is None or self._thread is None:
            return
        self._store.broadcast(CLOSE)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self._drain(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None

    async def _drain(self) -> None:
        """Let handlers cancelled by the cleanup finish, so none is left pending."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def api_client(self, **settings: Any) -> Any:
        """A real ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        for name, value in settings.items():
            setattr(configuration, name, value)
        return client.ApiClient(configuration)

    # ------------------------------------------------------------ objects

    def add(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object (its ``kind`` says where); watchers see ADDED."""
        rt = self.type_of(obj)
        with self._store.lock:
            return self._store.create(rt, copy.deepcopy(dict(obj)), None)

    def add_many(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Create many objects under one lock (no deep copy: the dicts are taken over)."""
        with self._store.lock:
            for obj in objs:
                self._store.create(self.type_of(obj), dict(obj), None)

    def modify(self, obj: Mapping[str, Any]) -> Obj:
        """Replace an existing object unconditionally; watchers see MODIFIED."""
        rt = self.type_of(obj)
        body = copy.deepcopy(dict(obj))
        meta = body["metadata"]
        meta.pop("resourceVersion", None)
        namespace = meta.setdefault("namespace", "default") if rt.namespaced else None
        with self._store.lock:
            return self._store.update(rt, body, namespace, meta["name"])

    def delete(self, kind: str, name: str, namespace: str = "default") -> Obj:
        """Delete by kind (or plural) and name; watchers see DELETED."""
        rt = self.type_named(kind)
        with self._store.lock:
            return self._store.delete(rt, namespace if rt.namespaced else None, name)

    def get(self, kind: str, name: str, namespace: str = "default") -> Obj | None:
        rt = self.type_named(kind)
        key = f"{namespace}/{name}" if rt.namespaced else name
        with self._store.lock:
            found = self._store.objects[rt.plural].get(key)
            return copy.deepcopy(found) if found else None

    def objects(self, kind: str) -> list[Obj]:
        with self._store.lock:
            return copy.deepcopy(list(self._store.objects[self.type_named(kind).plural].values()))

    @property
    def resource_version(self) -> str:
        with self._store.lock:
            return str(self._store.rv)

    @staticmethod
    def type_of(obj: Mapping[str, Any]) -> ResourceType:
        return resources.type_of(obj)

    @staticmethod
    def type_named(name: str) -> ResourceType:
        return resources.type_named(name)

    # ------------------------------------------------------------ watches

    def compact(self) -> None:
        """Forget all history: watches from an older resourceVersion now get 410."""
        with self._store.lock:
            self._store.compacted = self._store.rv
            self._store.history.clear()
            self._store.snapshots.clear()

    def expire_watches(self) -> None:
        """Compact, and send open watches an ERROR 410 event (the watch cache fell behind)."""
        with self._store.lock:
            self.compact()
            self.error_watches(410)

    def error_watches(self, code: int = 500) -> None:
        """Send open watches an ERROR event carrying a Status of ``code``; they then end."""
        with self._store.lock:
            for watcher in self._store.watchers:
                if code == 410:
                    status = status_object(410, f"too old resource version: {watcher.since} "
                                                f"({self._store.compacted})", "Expired")  # fmt: skip
                else:
                    status = status_object(code, f"injected watch error ({code})")
                watcher.send({"type": "ERROR", "object": status})

    def drop_watches(self) -> None:
        """Abort every open watch connection mid-stream."""
        self._store.broadcast(DROP)

    def send_bookmark(self) -> str:
        """Send a BOOKMARK at the current resourceVersion to watches that allow them."""
        with self._store.lock:
            for watcher in self._store.watchers:
                if watcher.bookmarks:
                    watcher.send({"type": "BOOKMARK", "object": self._store.bookmark(watcher.rt)})
            return str(self._store.rv)

    def open_watches(self, kind: str | None = None) -> int:
        with self._store.lock:
            return sum(1 for w in self._store.watchers if kind is None or w.rt == self.type_named(kind))

    # ------------------------------------------------------------ requests

    def serve(self, plural: str, served: bool = True) -> None:
        """Install (``served``) or remove the CRD of a custom resource: unserved, every request for it
        (its discovery document too) is a 404, and its objects stay in the store for when it comes back."""
        with self._store.lock:
            if served:
                self._store.unserved.discard(plural)
            else:
                self._store.unserved.add(plural)

    def fail_next(
        self, n: int, status: int = 500, *, path_contains: str | None = None, watch: bool | None = None
    ) -> None:
        """Answer the next ``n`` matching requests with a Status of ``status``."""
        self._log.schedule(Failure(n, status, path_contains, watch))

    def hold(self, path_contains: str, query_key: str) -> Hold:
        """Keep the next request to a path containing ``path_contains`` whose query has
        ``query_key`` (``continue``: a later page of a list) unanswered until the test sets
        the returned hold's ``release``; its ``reached`` is set when the request arrives."""
        hold = Hold(path_contains, query_key)
        self._log.add_hold(hold)
        return hold

    def clear_failures(self) -> None:
        """Forget failures that ``fail_next`` scheduled and that did not happen yet."""
        self._log.clear_failures()

    def requests(
        self, *, path_contains: str | None = None, watch: bool | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        """The request log, filtered."""
        return self._log.select(path_contains=path_contains, watch=watch, method=method)

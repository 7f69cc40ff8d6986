"""A fake Kubernetes API server that speaks the real REST protocol, for tests.

The real ``kubernetes`` client talks to it as to kube-apiserver: typed list
and watch calls, get/create/update/patch/delete, Status errors. It runs on
its own event loop in a thread of its own, so blocking clients in the test
thread and asyncio tests can both use it, and every control method
(``add``, ``compact``, ``drop_watches``, ``fail_next`` ...) is thread-safe.

What it reproduces, after the API conventions
(https://kubernetes.io/docs/reference/using-api/api-concepts/):

- one global, monotonically increasing ``resourceVersion`` (a string on the
  wire) stamped on every write, plus ``uid`` and ``creationTimestamp``;
- lists ``{"kind": "PodList", "apiVersion": "v1", "metadata":
  {"resourceVersion", "continue", "remainingItemCount"}, "items": [...]}``,
  items without ``kind``, ordered by key like etcd, paginated with
  ``limit``/``continue`` over a consistent snapshot;
- watches: chunked JSON lines ``{"type", "object"}`` from a resourceVersion
  on, synthetic ADDED events when it is unset or "0", ``timeoutSeconds``,
  BOOKMARK events (``allowWatchBookmarks``), ERROR events with a 410
  ``Expired`` Status once the history was compacted;
- Status objects for 404/409/410/422/500 as kube-apiserver writes them.

Simplifications: label selectors are equality based, strategic merge patch
merges lists of named objects by ``name`` and replaces other lists, a list
at an exact older ``resourceVersion`` is refused with 410.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import copy
import datetime
import json
import random
import socket
import ssl
import string
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
from aiohttp import web

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives and what its objects are called."""

    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How kube-apiserver names the resource in messages (``x.group``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


TYPES: tuple[ResourceType, ...] = (
    ResourceType("nodes", "Node"),
    ResourceType("namespaces", "Namespace"),
    ResourceType("pods", "Pod", namespaced=True),
    ResourceType("resourcequotas", "ResourceQuota", namespaced=True),
    ResourceType("secrets", "Secret", namespaced=True),
    ResourceType("configmaps", "ConfigMap", namespaced=True),
    ResourceType("priorityclasses", "PriorityClass", "scheduling.k8s.io"),
    ResourceType("runtimeclasses", "RuntimeClass", "node.k8s.io"),
    ResourceType(
        "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", "admissionregistration.k8s.io"
    ),
    ResourceType(
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        "admissionregistration.k8s.io",
    ),
)
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}  # fmt: skip
_DROP = object()  # queue sentinel: abort the connection mid-stream
_CLOSE = object()  # queue sentinel: end the stream cleanly


class ApiError(Exception):
    """A request the fake answers with a Status object."""

    def __init__(self, code: int, message: str, reason: str = "", details: Obj | None = None):
        super().__init__(message)
        self.status = status_object(code, message, reason, details)


def status_object(code: int, message: str, reason: str = "", details: Obj | None = None) -> Obj:
    """A ``Status`` of failure, shaped like kube-apiserver's."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    body["reason"] = reason or _REASONS.get(code, "Unknown")
    if details:
        body["details"] = details
    body["code"] = code
    return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    details = {"name": name, "kind": rt.plural} | ({"group": rt.group} if rt.group else {})
    return ApiError(404, f'{rt.qualified} "{name}" not found', "NotFound", details)


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
_RECORD: Any = web.RequestKey("record", RequestRecord) if hasattr(web, "RequestKey") else "record"


@dataclass
class _Failure:
    remaining: int
    code: int
    path_contains: str | None
    watch: bool | None


@dataclass(eq=False)
class _Watcher:
    rt: ResourceType
    namespace: str | None
    selector: _Selector
    bookmarks: bool
    loop: asyncio.AbstractEventLoop
    since: int = 0  # the resourceVersion the watch started from
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True)
class _Selector:
    """Equality-based label and field selectors (``a=b,c!=d,e,!f``)."""

    labels: tuple[tuple[str, str, str | None], ...] = ()
    fields: tuple[tuple[str, str, str | None], ...] = ()

    @classmethod
    def parse(cls, labels: str, fields: str) -> _Selector:
        return cls(_requirements(labels), _requirements(fields))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        values = meta.get("labels") or {}
        own = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace", "")}
        return all(_holds(r, values) for r in self.labels) and all(_holds(r, own) for r in self.fields)


def _requirements(text: str) -> tuple[tuple[str, str, str | None], ...]:
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "(" in part:
            raise ApiError(400, f"set-based selector not supported by the fake: {part}")
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            out.append((part.lstrip("!"), "!" if part.startswith("!") else "exists", None))
    return tuple(out)


def _holds(req: tuple[str, str, str | None], values: Mapping[str, Any]) -> bool:
    key, op, value = req
    if op == "exists":
        return key in values
    if op == "!":
        return key not in values
    return (values.get(key) == value) == (op == "=")


def _key(obj: Mapping[str, Any]) -> str:
    """The etcd-like sort key: ``namespace/name``, or ``name`` when cluster scoped."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])


def _number(text: str | None) -> int:
    """A numeric query parameter (resourceVersion, limit); 0 when absent."""
    try:
        return int(text or 0)
    except ValueError as exc:
        raise ApiError(400, f"Invalid value: {text!r}: must be an integer") from exc


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _encode_continue(rv: int, last_key: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(raw["rv"]), str(raw["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, f"continue key is not valid: {exc}", "BadRequest") from exc


def _merge(target: Any, patch: Any, strategic: bool) -> Any:
    """RFC 7386 merge patch; with ``strategic``, named list items merge by name."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and _named_list(value) and _named_list(result.get(key)):
            result[key] = _merge_named(result[key], value)
        else:
            result[key] = _merge(result.get(key), value, strategic)
    return result


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


def _merge_named(current: list[Obj], patch: list[Obj]) -> list[Obj]:
    merged = {item["name"]: item for item in current}
    for item in patch:
        if item.get("$patch") == "delete":
            merged.pop(item["name"], None)
        else:
            merged[item["name"]] = _merge(merged.get(item["name"]), item, True)
    return list(merged.values())


class FakeApiServer:
    """The fake kube-apiserver. Use as a context manager, or ``start()``/``stop()``."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        history_limit: int = 200_000,
        default_namespaces: Iterable[str] = DEFAULT_NAMESPACES,
    ) -> None:
        self._ssl = ssl_context
        self._history_limit = history_limit
        self._lock = threading.RLock()
        self._rv = 0
        self._compacted = 0  # watches from an older resourceVersion get 410
        self._objects: dict[str, dict[str, Obj]] = {rt.plural: {} for rt in TYPES}
        self._history: collections.deque[tuple[int, ResourceType, Obj]] = collections.deque()
        self._snapshots: collections.OrderedDict[tuple[Any, ...], tuple[list[str], list[Obj]]] = (
            collections.OrderedDict()
        )
        self._watchers: set[_Watcher] = set()
        self._failures: list[_Failure] = []
        self._log: list[RequestRecord] = []
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
        app = web.Application(middlewares=[self._middleware], client_max_size=8 * 1024 * 1024)
        app.router.add_get("/version", self._server_version)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
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
        self._broadcast(_CLOSE)
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

    # ------------------------------------------------------------ test controls

    def add(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object (its ``kind`` says where); watchers see ADDED."""
        rt = self.type_of(obj)
        with self._lock:
            return self._create(rt, copy.deepcopy(dict(obj)), None)

    def add_many(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Create many objects under one lock (no deep copy: the dicts are taken over)."""
        with self._lock:
            for obj in objs:
                self._create(self.type_of(obj), dict(obj), None)

    def modify(self, obj: Mapping[str, Any]) -> Obj:
        """Replace an existing object unconditionally; watchers see MODIFIED."""
        rt = self.type_of(obj)
        body = copy.deepcopy(dict(obj))
        meta = body["metadata"]
        meta.pop("resourceVersion", None)
        namespace = meta.setdefault("namespace", "default") if rt.namespaced else None
        with self._lock:
            return self._update(rt, body, namespace, meta["name"])

    def delete(self, kind: str, name: str, namespace: str = "default") -> Obj:
        """Delete by kind (or plural) and name; watchers see DELETED."""
        rt = self.type_named(kind)
        with self._lock:
            return self._delete(rt, namespace if rt.namespaced else None, name)

    def get(self, kind: str, name: str, namespace: str = "default") -> Obj | None:
        rt = self.type_named(kind)
        key = f"{namespace}/{name}" if rt.namespaced else name
        with self._lock:
            found = self._objects[rt.plural].get(key)
            return copy.deepcopy(found) if found else None

    def objects(self, kind: str) -> list[Obj]:
        with self._lock:
            return copy.deepcopy(list(self._objects[self.type_named(kind).plural].values()))

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def compact(self) -> None:
        """Forget all history: watches from an older resourceVersion now get 410."""
        with self._lock:
            self._compacted = self._rv
            self._history.clear()
            self._snapshots.clear()

    def expire_watches(self) -> None:
        """Compact, and send open watches an ERROR 410 event (the watch cache fell behind)."""
        with self._lock:
            self.compact()
            self.error_watches(410)

    def error_watches(self, code: int = 500) -> None:
        """Send open watches an ERROR event carrying a Status of ``code``; they then end."""
        with self._lock:
            for watcher in self._watchers:
                if code == 410:
                    status = status_object(410, f"too old resource version: {watcher.since} "
                                                f"({self._compacted})", "Expired")  # fmt: skip
                else:
                    status = status_object(code, f"injected watch error ({code})")
                watcher.send({"type": "ERROR", "object": status})

    def drop_watches(self) -> None:
        """Abort every open watch connection mid-stream."""
        self._broadcast(_DROP)

    def send_bookmark(self) -> str:
        """Send a BOOKMARK at the current resourceVersion to watches that allow them."""
        with self._lock:
            for watcher in self._watchers:
                if watcher.bookmarks:
                    watcher.send({"type": "BOOKMARK", "object": self._bookmark(watcher.rt)})
            return str(self._rv)

    def fail_next(
        self, n: int, status: int = 500, *, path_contains: str | None = None, watch: bool | None = None
    ) -> None:
        """Answer the next ``n`` matching requests with a Status of ``status``."""
        with self._lock:
            self._failures.append(_Failure(n, status, path_contains, watch))

    def clear_failures(self) -> None:
        """Forget failures that ``fail_next`` scheduled and that did not happen yet."""
        with self._lock:
            self._failures.clear()

    def requests(
        self, *, path_contains: str | None = None, watch: bool | None = None, method: str | None = None
    ) -> list[RequestRecord]:
        """The request log, filtered."""
        with self._lock:
            return [
                r
                for r in self._log
                if (path_contains is None or path_contains in r.path)
                and (watch is None or r.watch == watch)
                and (method is None or r.method == method)
            ]

    def open_watches(self, kind: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watchers if kind is None or w.rt == self.type_named(kind))

    @staticmethod
    def type_of(obj: Mapping[str, Any]) -> ResourceType:
        for rt in TYPES:
            if rt.kind == obj.get("kind") and rt.api_version == obj.get("apiVersion", rt.api_version):
                return rt
        raise ValueError(f"the fake serves no kind {obj.get('kind')!r}")

    @staticmethod
    def type_named(name: str) -> ResourceType:
        for rt in TYPES:
            if name in (rt.kind, rt.plural):
                return rt
        raise ValueError(f"the fake serves no resource {name!r}")

    # ------------------------------------------------------------ storage (lock held)

    def _create(self, rt: ResourceType, obj: Obj, namespace: str | None) -> Obj:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, f"{rt.kind} is invalid: metadata.name: Required value: "
                                    "name or generateName is required")  # fmt: skip
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        if rt.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            if meta["namespace"] not in self._objects["namespaces"]:
                raise _not_found(self.type_named("namespaces"), meta["namespace"])
        if _key(obj) in self._objects[rt.plural]:
            raise ApiError(409, f'{rt.qualified} "{meta["name"]}" already exists', "AlreadyExists",
                           {"name": meta["name"], "kind": rt.plural})  # fmt: skip
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if rt.group == "admissionregistration.k8s.io":
            meta["generation"] = 1
        if rt.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
        return self._write(rt, "ADDED", obj)

    def _update(self, rt: ResourceType, obj: Obj, namespace: str | None, name: str) -> Obj:
        key = f"{namespace}/{name}" if rt.namespaced else name
        current = self._objects[rt.plural].get(key)
        if current is None:
            raise _not_found(rt, name)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, f"the name of the object ({meta['name']}) does not match the "
                                f"name on the URL ({name})")  # fmt: skip
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": the '
                           "object has been modified; please apply your changes to the latest "
                           "version and try again", "Conflict",
                           {"name": name, "kind": rt.plural})  # fmt: skip
        kept = {k: current["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "generation")
                if k in current["metadata"]}  # fmt: skip
        meta.update(kept, name=name)
        if "generation" in kept:
            meta["generation"] = kept["generation"] + 1
        return self._write(rt, "MODIFIED", obj)

    def _delete(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        key = f"{namespace}/{name}" if rt.namespaced else name
        current = self._objects[rt.plural].get(key)
        if current is None:
            raise _not_found(rt, name)
        gone = copy.deepcopy(current)
        return self._write(rt, "DELETED", gone)

    def _write(self, rt: ResourceType, event_type: str, obj: Obj) -> Obj:
        self._rv += 1
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        meta["managedFields"] = [{"manager": "fakeapi", "operation": "Update", "time": _now(),
                                  "apiVersion": rt.api_version, "fieldsType": "FieldsV1",
                                  "fieldsV1": {"f:metadata": {}}}]  # fmt: skip
        if rt.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        if rt.plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        if event_type == "DELETED":
            del self._objects[rt.plural][_key(obj)]
        else:
            self._objects[rt.plural][_key(obj)] = obj
        self._history.append((self._rv, rt, {"type": event_type, "object": obj}))
        if len(self._history) > self._history_limit:
            self._compacted = self._history.popleft()[0]
        for watcher in self._watchers:
            if watcher.rt == rt and self._visible(watcher, obj):
                watcher.send({"type": event_type, "object": obj})
        return obj

    @staticmethod
    def _visible(watcher: _Watcher, obj: Obj) -> bool:
        if watcher.namespace is not None and obj["metadata"].get("namespace") != watcher.namespace:
            return False
        return watcher.selector.matches(obj)

    def _broadcast(self, item: object) -> None:
        with self._lock:
            for watcher in self._watchers:
                watcher.send(item)

    def _bookmark(self, rt: ResourceType, annotations: Obj | None = None) -> Obj:
        meta: Obj = {"resourceVersion": str(self._rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    # ------------------------------------------------------------ HTTP

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        record = RequestRecord(request.method, request.path, dict(request.query), dict(request.headers))
        request[_RECORD] = record
        with self._lock:
            self._log.append(record)
            failure = self._take_failure(record)
        try:
            if failure is not None:
                message = "Internal error occurred: injected failure" if failure == 500 else "injected failure"
                raise ApiError(failure, message)
            response = await handler(request)
        except ApiError as exc:
            response = web.json_response(exc.status, status=exc.status["code"])
        record.status = response.status
        return response

    def _take_failure(self, record: RequestRecord) -> int | None:
        for failure in self._failures:
            if failure.remaining > 0 and (failure.watch is None or failure.watch == record.watch) and (
                failure.path_contains is None or failure.path_contains in record.path
            ):
                failure.remaining -= 1
                return failure.code
        return None

    async def _server_version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake",
                                  "platform": "linux/amd64"})  # fmt: skip

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        rt, namespace, name = self._route(request.path)
        method = request.method
        if name is None and method == "GET":
            if request.query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, rt, namespace)
            return self._list(request, rt, namespace)
        if name is None and method == "POST" and (namespace is not None or not rt.namespaced):
            obj = await self._body(request, rt)
            with self._lock:
                return web.json_response(self._create(rt, obj, namespace), status=201)
        if name is not None and method in ("GET", "PUT", "PATCH", "DELETE"):
            return await self._item(request, rt, namespace, name)
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _route(self, path: str) -> tuple[ResourceType, str | None, str | None]:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        namespace = None
        if len(rest) in (3, 4) and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        for rt in TYPES:
            if (rt.group, rt.version, rt.plural) == (group, version, rest[0] if rest else None):
                if len(rest) <= 2 and (namespace is None or rt.namespaced):
                    return rt, namespace, rest[1] if len(rest) == 2 else None
        raise ApiError(404, "the server could not find the requested resource")

    @staticmethod
    async def _body(request: web.Request, rt: ResourceType | None = None) -> Any:
        """The JSON body; with ``rt``, an object of that resource's kind."""
        try:
            body = await request.json(loads=json.loads)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
        if rt is None:
            return body
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise ApiError(400, f"the request body is not a {rt.kind} object")
        if body.get("kind", rt.kind) != rt.kind:
            raise ApiError(400, f"the API version in the data ({body.get('apiVersion')}) / kind "
                                f"({body['kind']}) does not match the expected {rt.kind}")  # fmt: skip
        return body

    async def _item(
        self, request: web.Request, rt: ResourceType, namespace: str | None, name: str
    ) -> web.Response:
        key = f"{namespace}/{name}" if rt.namespaced else name
        body: Any = None
        if request.method in ("PUT", "PATCH"):
            body = await self._body(request, rt if request.method == "PUT" else None)
        with self._lock:
            current = self._objects[rt.plural].get(key)
            if request.method == "GET":
                if current is None:
                    raise _not_found(rt, name)
                return web.json_response(current)
            if request.method == "PUT":
                return web.json_response(self._update(rt, body, namespace, name))
            if request.method == "DELETE":
                gone = self._delete(rt, namespace, name)
                details = {"name": name, "kind": rt.plural, "uid": gone["metadata"]["uid"]}
                if rt.group:
                    details["group"] = rt.group
                return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                          "status": "Success", "details": details})  # fmt: skip
            if current is None:
                raise _not_found(rt, name)
            patched = self._patch(rt, current, body, request.content_type)
            return web.json_response(self._update(rt, patched, namespace, name))

    @staticmethod
    def _patch(rt: ResourceType, current: Obj, patch: Any, content_type: str) -> Obj:
        if content_type == "application/json-patch+json":
            try:
                return jsonpatch.apply_patch(current, patch)  # type: ignore[no-any-return]
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, f"the server rejected our request due to an error in our "
                                    f"request: {exc}", "Invalid") from exc  # fmt: skip
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            return _merge(copy.deepcopy(current), patch, "strategic" in content_type)  # type: ignore[no-any-return]
        raise ApiError(415, f"the body of the request was in an unknown format - accepted media "
                            f"types include: application/json-patch+json, application/merge-patch"
                            f"+json, application/strategic-merge-patch+json")  # fmt: skip

    def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        query = request.query
        selector = _Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        limit = _number(query.get("limit"))
        with self._lock:
            if query.get("continue"):
                rv, start = _decode_continue(query["continue"])
                keys, items = self._snapshot_at(rv, rt, namespace, selector)
                first = bisect.bisect_left(keys, start)
            else:
                rv = self._list_rv(query)
                keys, items = self._snapshot(rv, rt, namespace, selector, remember=limit > 0)
                first = 0
        end = first + limit if limit else len(items)
        meta: Obj = {"resourceVersion": str(rv)}
        if end < len(items):
            meta["continue"] = _encode_continue(rv, keys[end - 1])
            meta["remainingItemCount"] = len(items) - end
        page = [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")}
                for item in items[first:end]]  # fmt: skip
        body = {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": page}
        return web.json_response(body)

    def _list_rv(self, query: Mapping[str, str]) -> int:
        wanted = query.get("resourceVersion", "")
        if wanted in ("", "0"):
            return self._rv
        number = _number(wanted)
        if number > self._rv:
            raise ApiError(504, f"Too large resource version: {number}, current: {self._rv}", "Timeout")
        if query.get("resourceVersionMatch") == "Exact" and number != self._rv:
            raise ApiError(410, f"too old resource version: {number} ({self._rv})", "Expired")
        return self._rv

    def _snapshot(
        self, rv: int, rt: ResourceType, namespace: str | None, selector: _Selector, *, remember: bool
    ) -> tuple[list[str], list[Obj]]:
        chosen = sorted(
            (k, o) for k, o in self._objects[rt.plural].items()
            if (namespace is None or o["metadata"].get("namespace") == namespace) and selector.matches(o)
        )  # fmt: skip
        snapshot = ([k for k, _ in chosen], [o for _, o in chosen])
        if remember:
            self._snapshots[(rv, rt, namespace, selector)] = snapshot
            while len(self._snapshots) > 64:
                self._snapshots.popitem(last=False)
        return snapshot

    def _snapshot_at(
        self, rv: int, rt: ResourceType, namespace: str | None, selector: _Selector
    ) -> tuple[list[str], list[Obj]]:
        snapshot = self._snapshots.get((rv, rt, namespace, selector))
        if rv < self._compacted or snapshot is None:
            raise ApiError(410, "The provided continue parameter is too old to display a "
                           "consistent list result. You can start a new list without the continue "
                           "parameter.", "Expired")  # fmt: skip
        return snapshot

    async def _watch(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.StreamResponse:
        query = request.query
        selector = _Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        watcher = _Watcher(rt, namespace, selector, query.get("allowWatchBookmarks") in ("true", "1"),
                           asyncio.get_running_loop())  # fmt: skip
        with self._lock:
            watcher.since = _number(query.get("resourceVersion")) or self._rv
            backlog = self._backlog(watcher, query)
            if not backlog or backlog[-1]["type"] != "ERROR":
                self._watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            request[_RECORD].status = response.status  # a watch is logged once its headers are out
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            ended = bool(backlog) and backlog[-1]["type"] == "ERROR"
            timeout = float(query.get("timeoutSeconds") or 1800)
            if ended or await self._pump(watcher, request, response, timeout):
                await response.write_eof()
            elif request.transport is not None:
                request.transport.abort()
        except ConnectionResetError:
            pass  # the client went away: nothing to tell it
        finally:
            with self._lock:
                self._watchers.discard(watcher)
        return response

    def _backlog(self, watcher: _Watcher, query: Mapping[str, str]) -> list[Obj]:
        wanted = query.get("resourceVersion", "")
        if wanted in ("", "0"):
            events = [{"type": "ADDED", "object": o} for o in self._objects[watcher.rt.plural].values()
                      if self._visible(watcher, o)]  # fmt: skip
            if watcher.bookmarks and query.get("sendInitialEvents") in ("true", "1"):
                events.append({"type": "BOOKMARK",
                               "object": self._bookmark(watcher.rt, {INITIAL_EVENTS_END: "true"})})  # fmt: skip
            return events
        since = _number(wanted)
        if since < self._compacted:
            expired = status_object(410, f"too old resource version: {since} ({self._compacted})", "Expired")
            return [{"type": "ERROR", "object": expired}]
        return [e for rv, rt, e in self._history
                if rv > since and rt == watcher.rt and self._visible(watcher, e["object"])]  # fmt: skip

    @staticmethod
    async def _pump(
        watcher: _Watcher, request: web.Request, response: web.StreamResponse, timeout: float
    ) -> bool:
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
            if item is _DROP:
                return False
            if item is _CLOSE:
                return True
            await response.write(json.dumps(item).encode() + b"\n")
            if item["type"] == "ERROR":
                return True
        return True


def iter_requests(records: Iterable[RequestRecord], param: str) -> Iterator[str]:
    """The values one query parameter took across requests (absent ones skipped)."""
    return (r.query[param] for r in records if param in r.query)

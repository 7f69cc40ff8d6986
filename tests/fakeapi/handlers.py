"""The HTTP side: routing and the list, watch, get, create, update, patch and delete handlers.

:class:`Handlers` builds the aiohttp application. Its middleware logs every
request, answers it with an injected failure when one is due, and turns an
:class:`~tests.fakeapi.status.ApiError` into a ``Status`` response. Paths
are routed as kube-apiserver's (``/api/v1/...``, ``/apis/<group>/<version>/...``,
``namespaces/<ns>/`` for namespaced resources).
"""

from __future__ import annotations

import asyncio
import bisect
import json
from typing import Any

from aiohttp import web

from tests.fakeapi.patch import APPLY, apply_patch
from tests.fakeapi.query import decode_continue, encode_continue, number
from tests.fakeapi.request_log import RECORD, RequestLog, RequestRecord
from tests.fakeapi.resources import CUSTOM_GROUPS, TYPES, Obj, ResourceType
from tests.fakeapi.selector import Selector
from tests.fakeapi.status import ApiError, not_found
from tests.fakeapi.store import Store
from tests.fakeapi.watch import Watcher, pump


class Handlers:
    """The request handlers of one fake server, over its store and request log."""

    def __init__(self, store: Store, log: RequestLog) -> None:
        self._store = store
        self._log = log

    def application(self) -> web.Application:
        """The aiohttp application; build it on the loop that will serve it."""
        app = web.Application(middlewares=[self._middleware], client_max_size=8 * 1024 * 1024)
        app.router.add_get("/version", self._server_version)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        record = RequestRecord(request.method, request.path, dict(request.query), dict(request.headers))
        request[RECORD] = record
        failure = self._log.receive(record)
        held = self._log.take_hold(record)
        if held is not None:
            held.reached.set()
            while not held.release.is_set():
                await asyncio.sleep(0.005)
        try:
            if failure is not None:
                message = "Internal error occurred: injected failure" if failure == 500 else "injected failure"
                raise ApiError(failure, message)
            response = await handler(request)
        except ApiError as exc:
            response = web.json_response(exc.status, status=exc.status["code"])
        record.status = response.status
        return response

    async def _server_version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake",
                                  "platform": "linux/amd64"})  # fmt: skip

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        discovered = self._discovery(request.path) if request.method == "GET" else None
        if discovered is not None:
            return web.json_response(discovered)
        rt, namespace, name = self._route(request.path)
        with self._store.lock:
            if rt.plural in self._store.unserved:  # its CRD is not installed
                raise ApiError(404, "the server could not find the requested resource")
        method = request.method
        if name is None and method == "GET":
            if request.query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, rt, namespace)
            return self._list(request, rt, namespace)
        if name is None and method == "POST" and (namespace is not None or not rt.namespaced):
            obj = await self._body(request, rt)
            with self._store.lock:
                return web.json_response(self._store.create(rt, obj, namespace), status=201)
        if name is not None and method in ("GET", "PUT", "PATCH", "DELETE"):
            return await self._item(request, rt, namespace, name)
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _discovery(self, path: str) -> Obj | None:
        """The APIResourceList of a custom group's version (``/apis/<group>/<version>``), as kube-apiserver
        serves it once a CRD of it is installed; None when the path is no such document."""
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "apis" or parts[1] not in CUSTOM_GROUPS:
            return None
        with self._store.lock:
            served = [rt for rt in TYPES if (rt.group, rt.version) == (parts[1], parts[2])
                      and rt.plural not in self._store.unserved]
        if not served:
            raise ApiError(404, "the server could not find the requested resource")
        verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{parts[1]}/{parts[2]}",
                "resources": [{"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                               "kind": rt.kind, "verbs": verbs} for rt in served]}

    @staticmethod
    def _route(path: str) -> tuple[ResourceType, str | None, str | None]:
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
        store = self._store
        with store.lock:
            current = store.objects[rt.plural].get(key)
            if request.method == "GET":
                if current is None:
                    raise not_found(rt, name)
                return web.json_response(current)
            if request.method == "PUT":
                return web.json_response(store.update(rt, body, namespace, name))
            if request.method == "DELETE":
                gone = store.delete(rt, namespace, name)
                details = {"name": name, "kind": rt.plural, "uid": gone["metadata"]["uid"]}
                if rt.group:
                    details["group"] = rt.group
                return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                          "status": "Success", "details": details})  # fmt: skip
            if current is None:
                if request.content_type == APPLY:  # server-side apply creates what is not there
                    return web.json_response(store.create(rt, body, namespace), status=201)
                raise not_found(rt, name)
            patched = apply_patch(current, body, request.content_type)
            return web.json_response(store.update(rt, patched, namespace, name))

    def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        query = request.query
        selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        limit = number(query.get("limit"))
        store = self._store
        with store.lock:
            if query.get("continue"):
                rv, start = decode_continue(query["continue"])
                keys, items = store.snapshot_at(rv, rt, namespace, selector)
                first = bisect.bisect_left(keys, start)
            else:
                rv = store.list_rv(query)
                keys, items = store.snapshot(rv, rt, namespace, selector, remember=limit > 0)
                first = 0
        end = first + limit if limit else len(items)
        meta: Obj = {"resourceVersion": str(rv)}
        if end < len(items):
            meta["continue"] = encode_continue(rv, keys[end - 1])
            meta["remainingItemCount"] = len(items) - end
        if "as=PartialObjectMetadataList" in request.headers.get("Accept", ""):
            # metadata only, as kube-apiserver answers kubectl get and clients that ask for it so
            partial = [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": item["metadata"]}
                       for item in items[first:end]]  # fmt: skip
            return web.json_response({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                      "metadata": meta, "items": partial})  # fmt: skip
        page = [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")}
                for item in items[first:end]]  # fmt: skip
        body = {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": page}
        return web.json_response(body)

    async def _watch(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.StreamResponse:
        query = request.query
        selector = Selector.parse(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        watcher = Watcher(rt, namespace, selector, query.get("allowWatchBookmarks") in ("true", "1"),
                          asyncio.get_running_loop())  # fmt: skip
        store = self._store
        with store.lock:
            watcher.since = number(query.get("resourceVersion")) or store.rv
            backlog = store.backlog(watcher, query)
            if not backlog or backlog[-1]["type"] != "ERROR":
                store.watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            request[RECORD].status = response.status  # a watch is logged once its headers are out
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            ended = bool(backlog) and backlog[-1]["type"] == "ERROR"
            timeout = float(query.get("timeoutSeconds") or 1800)
            if ended or await pump(watcher, request, response, timeout):
                await response.write_eof()
            elif request.transport is not None:
                request.transport.abort()
        except ConnectionResetError:
            pass  # the client went away: nothing to tell it
        finally:
            with store.lock:
                store.watchers.discard(watcher)
        return response

"""The object store: objects, resourceVersions, history and open watches.

One global, monotonically increasing ``resourceVersion`` is stamped on every
write, with ``uid`` and ``creationTimestamp`` on creation. Each write is
kept in a bounded history for watches that start from an older version and
is sent to the matching open watches; once history is dropped (the limit,
or ``compact``), older versions are answered with 410 ``Expired``. Lists
with ``limit`` remember a snapshot so continue tokens page through a
consistent result.

Everything here is guarded by :attr:`Store.lock`; the methods expect the
caller to hold it, except :meth:`Store.broadcast`.
"""

from __future__ import annotations

import base64
import collections
import copy
import datetime
import json
import random
import string
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from tests.fakeapi.query import number
from tests.fakeapi.resources import TYPES, Obj, ResourceType, object_key, type_named
from tests.fakeapi.selector import Selector
from tests.fakeapi.status import ApiError, not_found, status_object
from tests.fakeapi.watch import INITIAL_EVENTS_END, Watcher


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """The fake's state; every method but :meth:`broadcast` runs with :attr:`lock` held."""

    def __init__(self, history_limit: int, max_object_bytes: int | None = None) -> None:
        self.history_limit = history_limit
        #: etcd's request limit (1.5 MiB there): a bigger object is refused as kube-apiserver passes it on
        self.max_object_bytes = max_object_bytes
        self.lock = threading.RLock()
        self.rv = 0
        self.compacted = 0  # watches from an older resourceVersion get 410
        self.objects: dict[str, dict[str, Obj]] = {rt.plural: {} for rt in TYPES}
        self.history: collections.deque[tuple[int, ResourceType, Obj]] = collections.deque()
        self.snapshots: collections.OrderedDict[tuple[Any, ...], tuple[list[str], list[Obj]]] = (
            collections.OrderedDict()
        )
        self.watchers: set[Watcher] = set()
        #: plurals of custom resources whose CRD is not installed: 404 for everything, discovery included
        self.unserved: set[str] = set()

    # ------------------------------------------------------------ writes

    def create(self, rt: ResourceType, obj: Obj, namespace: str | None) -> Obj:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, f"{rt.kind} is invalid: metadata.name: Required value: "
                                    "name or generateName is required")  # fmt: skip
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        if rt.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            if meta["namespace"] not in self.objects["namespaces"]:
                raise not_found(type_named("namespaces"), meta["namespace"])
        if object_key(obj) in self.objects[rt.plural]:
            raise ApiError(409, f'{rt.qualified} "{meta["name"]}" already exists', "AlreadyExists",
                           {"name": meta["name"], "kind": rt.plural})  # fmt: skip
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if rt.group == "admissionregistration.k8s.io":
            meta["generation"] = 1
        if rt.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {"phase": "Active"})
        return self._write(rt, "ADDED", obj)

    def update(self, rt: ResourceType, obj: Obj, namespace: str | None, name: str) -> Obj:
        key = f"{namespace}/{name}" if rt.namespaced else name
        current = self.objects[rt.plural].get(key)
        if current is None:
            raise not_found(rt, name)
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

    def delete(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        key = f"{namespace}/{name}" if rt.namespaced else name
        current = self.objects[rt.plural].get(key)
        if current is None:
            raise not_found(rt, name)
        gone = copy.deepcopy(current)
        return self._write(rt, "DELETED", gone)

    def _write(self, rt: ResourceType, event_type: str, obj: Obj) -> Obj:
        if self.max_object_bytes is not None and event_type != "DELETED" and \
                len(json.dumps(obj)) > self.max_object_bytes:
            raise ApiError(500, "etcdserver: request is too large")  # (kube-apiserver answers etcd's refusal so)
        self.rv += 1
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
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
            del self.objects[rt.plural][object_key(obj)]
        else:
            self.objects[rt.plural][object_key(obj)] = obj
        self.history.append((self.rv, rt, {"type": event_type, "object": obj}))
        if len(self.history) > self.history_limit:
            self.compacted = self.history.popleft()[0]
        for watcher in self.watchers:
            if watcher.rt == rt and watcher.visible(obj):
                watcher.send({"type": event_type, "object": obj})
        return obj

    # ------------------------------------------------------------ watches

    def broadcast(self, item: object) -> None:
        """Queue ``item`` (an event or a sentinel) for every open watch; takes the lock."""
        with self.lock:
            for watcher in self.watchers:
                watcher.send(item)

    def bookmark(self, rt: ResourceType, annotations: Obj | None = None) -> Obj:
        """The object of a BOOKMARK event at the current resourceVersion."""
        meta: Obj = {"resourceVersion": str(self.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    def backlog(self, watcher: Watcher, query: Mapping[str, str]) -> list[Obj]:
        """The events a new watch starts with: synthetic ADDEDs, history, or a 410 ERROR."""
        wanted = query.get("resourceVersion", "")
        if wanted in ("", "0"):
            events = [{"type": "ADDED", "object": o} for o in self.objects[watcher.rt.plural].values()
                      if watcher.visible(o)]  # fmt: skip
            if watcher.bookmarks and query.get("sendInitialEvents") in ("true", "1"):
                events.append({"type": "BOOKMARK",
                               "object": self.bookmark(watcher.rt, {INITIAL_EVENTS_END: "true"})})  # fmt: skip
            return events
        since = number(wanted)
        if since < self.compacted:
            expired = status_object(410, f"too old resource version: {since} ({self.compacted})", "Expired")
            return [{"type": "ERROR", "object": expired}]
        return [e for rv, rt, e in self.history
                if rv > since and rt == watcher.rt and watcher.visible(e["object"])]  # fmt: skip

    # ------------------------------------------------------------ lists

    def list_rv(self, query: Mapping[str, str]) -> int:
        """The resourceVersion a list without a continue token is served at."""
        wanted = query.get("resourceVersion", "")
        if wanted in ("", "0"):
            return self.rv
        requested = number(wanted)
        if requested > self.rv:
            raise ApiError(504, f"Too large resource version: {requested}, current: {self.rv}", "Timeout")
        if query.get("resourceVersionMatch") == "Exact" and requested != self.rv:
            raise ApiError(410, f"too old resource version: {requested} ({self.rv})", "Expired")
        return self.rv

    def snapshot(
        self, rv: int, rt: ResourceType, namespace: str | None, selector: Selector, *, remember: bool
    ) -> tuple[list[str], list[Obj]]:
        """The matching keys and objects in key order; ``remember`` keeps them for continue tokens."""
        chosen = sorted(
            (k, o) for k, o in self.objects[rt.plural].items()
            if (namespace is None or o["metadata"].get("namespace") == namespace) and selector.matches(o)
        )  # fmt: skip
        snapshot = ([k for k, _ in chosen], [o for _, o in chosen])
        if remember:
            self.snapshots[(rv, rt, namespace, selector)] = snapshot
            while len(self.snapshots) > 64:
                self.snapshots.popitem(last=False)
        return snapshot

    def snapshot_at(
        self, rv: int, rt: ResourceType, namespace: str | None, selector: Selector
    ) -> tuple[list[str], list[Obj]]:
        """A remembered snapshot; 410 when it was compacted away or forgotten."""
        snapshot = self.snapshots.get((rv, rt, namespace, selector))
        if rv < self.compacted or snapshot is None:
            raise ApiError(410, "The provided continue parameter is too old to display a "
                           "consistent list result. You can start a new list without the continue "
                           "parameter.", "Expired")  # fmt: skip
        return snapshot

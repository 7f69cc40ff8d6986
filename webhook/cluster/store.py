"""The objects of one resource, readable without ever waiting.

Readers (the admission hot path, on the event loop) take no lock: every
write builds a new :class:`Snapshot` and publishes it with one attribute
assignment, which is atomic in CPython. A snapshot's dicts are never
mutated after publication, so a reader can iterate one while the watch
thread moves on. Writes copy only the touched namespace's bucket and the
small outer dict; a relist builds a whole new snapshot off to the side and
swaps it in, so readers see the old state or the new one, never a mix.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from webhook.policy.view import Object

CLUSTER = ""  # the bucket of cluster-scoped objects


class _Chain(Collection[Object]):
    """All objects of a snapshot: re-iterable, sized, built in O(namespaces)."""

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: tuple[Mapping[str, Object], ...], size: int) -> None:
        self._buckets = buckets
        self._size = size

    def __iter__(self) -> Iterator[Object]:
        for bucket in self._buckets:
            yield from bucket.values()

    def __len__(self) -> int:
        return self._size

    def __contains__(self, item: object) -> bool:
        return any(item in bucket.values() for bucket in self._buckets)


@dataclass(frozen=True)
class Snapshot:
    """Objects by namespace (``""`` for cluster-scoped ones), then by name."""

    buckets: Mapping[str, Mapping[str, Object]] = field(default_factory=dict)
    size: int = 0

    def get(self, namespace: str, name: str) -> Object | None:
        bucket = self.buckets.get(namespace)
        return bucket.get(name) if bucket is not None else None

    def in_namespace(self, namespace: str) -> Collection[Object]:
        bucket = self.buckets.get(namespace)
        return bucket.values() if bucket is not None else ()

    def all(self) -> Collection[Object]:
        return _Chain(tuple(self.buckets.values()), self.size)


def key_of(obj: Object) -> tuple[str, str]:
    """(namespace, name) of an object; namespace is ``""`` when cluster scoped."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or CLUSTER), str(meta.get("name", ""))


class Listener(Protocol):
    """Told of every write, after it is published (keeps per-snapshot aggregates current)."""

    def put(self, obj: Object) -> None: ...

    def discard(self, namespace: str, name: str) -> None: ...

    def replace(self, objects: Iterable[Object]) -> None: ...


class Store:
    """The current snapshot of one resource, and the writes that replace it."""

    def __init__(self, listener: Listener | None = None) -> None:
        self.snapshot = Snapshot()
        self._listener = listener
        # Only one watch thread writes a store; the lock keeps stray writers honest.
        self._write = threading.Lock()

    def put(self, obj: Object) -> None:
        namespace, name = key_of(obj)
        with self._write:
            old = self.snapshot
            bucket = dict(old.buckets.get(namespace, {}))
            added = name not in bucket
            bucket[name] = obj
            self.snapshot = Snapshot({**old.buckets, namespace: bucket}, old.size + added)
            if self._listener is not None:
                self._listener.put(obj)

    def discard(self, namespace: str, name: str) -> None:
        with self._write:
            old = self.snapshot
            if name not in old.buckets.get(namespace, {}):
                return
            buckets = dict(old.buckets)
            bucket = {k: v for k, v in buckets[namespace].items() if k != name}
            if bucket:
                buckets[namespace] = bucket
            else:
                del buckets[namespace]  # a deleted namespace leaves nothing behind
            self.snapshot = Snapshot(buckets, old.size - 1)
            if self._listener is not None:
                self._listener.discard(namespace, name)

    def replace(self, objects: Iterable[Object]) -> None:
        """Swap in a complete new state (a relist): objects not in it are gone."""
        buckets: dict[str, dict[str, Object]] = {}
        for obj in objects:
            namespace, name = key_of(obj)
            buckets.setdefault(namespace, {})[name] = obj
        snapshot = Snapshot(buckets, sum(len(b) for b in buckets.values()))
        with self._write:
            self.snapshot = snapshot
            if self._listener is not None:
                self._listener.replace(o for b in buckets.values() for o in b.values())

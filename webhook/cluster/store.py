"""The objects of one resource, readable without ever waiting.

Readers (the admission hot path, on the event loop) take no lock: every
write builds a new :class:`Snapshot` and publishes it with one attribute
assignment, which is atomic in CPython. A snapshot's maps are persistent
(``immutables.Map``, the hash array mapped trie behind CPython's
contextvars): a write makes a new map sharing all but O(log n) of its nodes
with the old one, which stays valid for whoever reads it. So one watch event
costs the same with 10,000 or 100,000 objects, where copying the touched
namespace's dict cost in proportion to it. A relist builds a whole new
snapshot off to the side and swaps it in, so readers see the old state or
the new one, never a mix.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from immutables import Map

from webhook.view.protocol import Object

CLUSTER = ""  # the bucket of cluster-scoped objects

#: one namespace's objects by name: a persistent map, so a write costs O(log n), not a copy
Bucket = Map[str, Object]
_EMPTY: Bucket = Map()


class _Values(Collection[Object]):
    """The objects of one bucket: re-iterable and sized, never copied."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket

    def __iter__(self) -> Iterator[Object]:
        return iter(self._bucket.values())

    def __len__(self) -> int:
        return len(self._bucket)

    def __contains__(self, item: object) -> bool:
        return any(item is o or item == o for o in self._bucket.values())


class _Chain(Collection[Object]):
    """All objects of a snapshot: re-iterable, sized, built in O(namespaces)."""

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: tuple[Bucket, ...], size: int) -> None:
        self._buckets = buckets
        self._size = size

    def __iter__(self) -> Iterator[Object]:
        for bucket in self._buckets:
            yield from bucket.values()

    def __len__(self) -> int:
        return self._size

    def __contains__(self, item: object) -> bool:
        return any(item in _Values(bucket) for bucket in self._buckets)


@dataclass(frozen=True)
class Snapshot:
    """Objects by namespace (``""`` for cluster-scoped ones), then by name."""

    buckets: Map[str, Bucket] = field(default_factory=Map)
    size: int = 0

    def get(self, namespace: str, name: str) -> Object | None:
        bucket = self.buckets.get(namespace)
        return bucket.get(name) if bucket is not None else None

    def in_namespace(self, namespace: str) -> Collection[Object]:
        bucket = self.buckets.get(namespace)
        return _Values(bucket) if bucket is not None else ()

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
            bucket = old.buckets.get(namespace, _EMPTY)
            added = name not in bucket
            self.snapshot = Snapshot(old.buckets.set(namespace, bucket.set(name, obj)), old.size + added)
            if self._listener is not None:
                self._listener.put(obj)

    def discard(self, namespace: str, name: str) -> None:
        with self._write:
            old = self.snapshot
            bucket = old.buckets.get(namespace, _EMPTY)
            if name not in bucket:
                return
            bucket = bucket.delete(name)
            # a deleted namespace leaves nothing behind
            buckets = old.buckets.set(namespace, bucket) if bucket else old.buckets.delete(namespace)
            self.snapshot = Snapshot(buckets, old.size - 1)
            if self._listener is not None:
                self._listener.discard(namespace, name)

    def replace(self, objects: Iterable[Object]) -> None:
        """Swap in a complete new state (a relist): objects not in it are gone."""
        buckets: dict[str, dict[str, Object]] = {}
        for obj in objects:
            namespace, name = key_of(obj)
            buckets.setdefault(namespace, {})[name] = obj
        snapshot = Snapshot(Map({k: Map(b) for k, b in buckets.items()}), sum(len(b) for b in buckets.values()))
        with self._write:
            self.snapshot = snapshot
            if self._listener is not None:
                self._listener.replace(o for b in buckets.values() for o in b.values())

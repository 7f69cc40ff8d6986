"""A time- and size-bounded cache of what the resolver learnt, by reference and by digest."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry(Generic[T]):
    value: T
    expires: float


class TTLCache(Generic[T]):
    """Least-recently-used entries, each valid until its own deadline; at most ``size`` of them."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        if size < 1:
            raise ValueError("a cache holds at least one entry")
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()

    def get(self, key: str) -> T | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: str, value: T, ttl: float) -> None:
        self._entries[key] = _Entry(value, self._clock() + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def items(self) -> list[tuple[str, T]]:
        """The entries still valid, least recently used first."""
        now = self._clock()
        return [(key, entry.value) for key, entry in self._entries.items() if entry.expires > now]

    def __len__(self) -> int:
        return len(self._entries)

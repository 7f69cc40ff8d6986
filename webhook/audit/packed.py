"""Many small texts kept compressed a block at a time, for a fleet's audit: its pods until they are
judged, its rendered results until the report's summary is known."""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterator


class Packed:
    """Byte strings in the order they were added, compressed ``BLOCK`` at a time (JSON compresses ~10x)."""

    #: items per compressed block
    BLOCK = 500

    def __init__(self) -> None:
        #: each block: its items' lengths, and their bytes compressed
        self._blocks: list[tuple[array[int], bytes]] = []
        self._pending: list[bytes] = []
        self._count = 0

    def add(self, item: bytes) -> None:
        self._count += 1
        self._pending.append(item)
        if len(self._pending) >= self.BLOCK:
            self._blocks.append((array("L", map(len, self._pending)), zlib.compress(b"".join(self._pending), 1)))
            self._pending = []

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[bytes]:
        for lengths, block in self._blocks:
            data, start = zlib.decompress(block), 0
            for length in lengths:
                yield data[start : start + length]
                start += length
        yield from list(self._pending)

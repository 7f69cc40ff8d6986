"""Memory a burst of admissions freed, handed back to the system once the burst is over.

While admissions come in, the reviews in flight (up to one per connection:
20 kube-apiserver connections of 20-container pods are megabytes), their
answers and TLS records are allocated and freed by the C allocator. Python
frees them all, but glibc's malloc keeps the pages it freed inside its heap
for the next allocation: after a burst the server's resident memory stays
~10 MB above where it started (docs/performance.md, "Memory after the
load"), which a container's memory accounting counts. ``malloc_trim(0)``
returns the whole free pages of every heap to the system (``madvise``,
not only the top of the heap).

:class:`Trimmer` calls it once after each burst: when admissions have been
taken since its last look and none since the one before. Under steady load it
never runs (the pages would be taken again at once); when nothing comes it
costs one comparison a second. With a C library without ``malloc_trim``
(musl) it does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

#: seconds between two looks: a burst is over once no admission came for this long
LOOK_INTERVAL = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        process = ctypes.CDLL(None)  # the process's own symbols: the C library it runs on
    except OSError:
        return None
    trim = getattr(process, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


class Trimmer:
    """Looks every second (``look``) at a count of admissions taken; trims once each time it has
    stopped moving."""

    def __init__(self, taken: Callable[[], int], trim: Callable[[int], int] | None = None) -> None:
        self._taken = taken
        self._trim = trim if trim is not None else _malloc_trim()
        self._seen = taken()
        self._busy = False
        self.trims = 0

    def look(self) -> None:
        now = self._taken()
        if now != self._seen:
            self._seen, self._busy = now, True
        elif self._busy and self._trim is not None:
            self._busy = False
            self._trim(0)
            self.trims += 1

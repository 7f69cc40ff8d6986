"""A progress line on stderr for long runs, on a terminal only.

Nothing appears for a run shorter than a second (most runs), nor when
stderr is a file or a CI log; redraws are limited to a few per second so
that drawing never costs more than the work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO

DELAY = 1.0  # seconds before the first draw
INTERVAL = 0.2  # seconds between draws
WIDTH = 30


class Progress:
    """Counts files and objects; draws ``[=====>     ] 120/400 files, 3,210 objects``.

    ``total`` is the number of files (0: not files, e.g. a cluster's workloads).
    """

    def __init__(self, stream: IO[str], total_files: int = 0, *, enabled: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._stream = stream
        self.total = total_files
        self._enabled = enabled
        self._clock = clock
        self._start = clock()
        self._next = self._start + DELAY
        self._drawn = False
        self.files = 0
        self.objects = 0

    def file_done(self) -> None:
        self.files += 1
        self._maybe_draw()

    def object_done(self) -> None:
        self.objects += 1
        if self.objects % 64 == 0:
            self._maybe_draw()

    def _maybe_draw(self) -> None:
        if not self._enabled:
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + INTERVAL
        self._stream.write("\r" + self.line())
        self._stream.flush()
        self._drawn = True

    def line(self) -> str:
        if not self.total:
            return f"{self.objects:,} objects"
        done = min(self.files, self.total)
        filled = WIDTH * done // self.total if self.total else WIDTH
        bar = "=" * filled + (">" if filled < WIDTH else "") + " " * max(WIDTH - filled - 1, 0)
        return f"[{bar}] {done}/{self.total} files, {self.objects:,} objects"

    def close(self) -> None:
        """Clear the line, so the report starts on a clean one."""
        if self._drawn:
            self._stream.write("\r" + " " * (WIDTH + 40) + "\r")
            self._stream.flush()

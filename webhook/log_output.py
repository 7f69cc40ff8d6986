"""Where the server's log lines go: a bounded buffer that a thread of its own writes out.

A process that logs with a plain ``StreamHandler`` writes each line with a
blocking ``write()`` on the thread that logs, for the server the event
loop. When whoever reads its stderr stops (a stalled log shipper or
container runtime shim), the pipe fills (64 KiB on Linux) and the next
``write()`` blocks the event loop: every admission and ``/healthz`` waits
until the reader comes back. Here a line is appended to a buffer in memory
(under a lock, never waiting on I/O) and a writer thread empties the
buffer into the file descriptor, a tenth of a second's lines at a time.
When the buffer holds ``limit`` bytes not yet written, further lines are
dropped and counted (``dropped``, exported as
``gpu_admission_log_lines_dropped_total``), and once the output takes
lines again one line says how many were dropped, where they would have
been.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
import time
from collections.abc import Callable

#: bytes of lines waiting for the writer, at most: ~2,000 decision lines. The writer holds at
#: most as much again (the batch it is writing), so memory stays within twice this
BUFFER_BYTES = 1 << 20
#: seconds the writer gathers lines before it writes them, unless the buffer is half full first.
#: A write per line cost the server more than the line itself: on a shared core every write is a
#: switch to the writer thread and back, and wakes the reader on the other side of the pipe
BATCH_SECONDS = 0.1


class LogOutput:
    """Lines (bytes, each ending in a newline) written to ``fd`` by a thread of its own, never waited for.

    ``notice(n)`` makes the line that says ``n`` lines were dropped; ``batch``
    is how long the writer gathers lines. ``write`` may be called from any
    thread; ``dropped`` is the count so far.
    """

    def __init__(self, fd: int, notice: Callable[[int], bytes], limit: int = BUFFER_BYTES, batch: float = BATCH_SECONDS) -> None:
        self.fd, self.limit, self.batch = fd, limit, batch
        self._half = limit // 2
        self.dropped = 0
        self._notice = notice
        self._lock = threading.Lock()
        self._lines: list[bytes] = []
        self._size = 0
        self._unreported = 0  # lines dropped since the last notice
        self._taken = self._written = 0  # lines the writer took from the buffer, and wrote: for flush
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._closing = self._stalled = False
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def write(self, line: bytes) -> None:
        """Queue ``line`` for the writer, or count it dropped when the buffer is full."""
        lock, size = self._lock, len(line)
        lock.acquire()  # (not `with`: its two calls are a third of this method)
        before = self._size
        if before + size > self.limit:
            self.dropped += 1
            self._unreported += 1
            lock.release()
            return
        lines = self._lines
        # the first line wakes the writer, which gathers more for BATCH_SECONDS; half the buffer cuts
        # that short (a writer with lines in hand looks again once it has written them)
        wake = not lines or before < self._half <= before + size
        lines.append(line)
        self._size = before + size
        lock.release()
        if wake:
            self._wake.put(None)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lines queued so far to be written; whether they were.
        Once a wait has run out, the output is taken as stalled: later ones do not wait."""
        with self._lock:
            target = self._taken + len(self._lines)
        self._wake.put(None)  # (no gathering: written now)
        deadline = time.monotonic() + (0 if self._stalled else timeout)
        while self._written < target and self._thread.is_alive():
            if time.monotonic() >= deadline:
                self._stalled = True
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds for a stalled output), then stop the writer."""
        self._closing = True
        self._wake.put(None)
        self._thread.join(0 if self._stalled else timeout)
        self._stalled = self._stalled or self._thread.is_alive()

    def _run(self) -> None:
        while True:
            self._wake.get()
            with contextlib.suppress(queue.Empty):  # more lines, unless told to write now
                self._wake.get(timeout=self.batch)
            while True:
                with self._lock:
                    lines, unreported = self._lines, self._unreported
                    self._lines, self._size, self._unreported = [], 0, 0
                    self._taken += len(lines)
                if not lines and not unreported:
                    break
                if lines:
                    self._send(b"".join(lines), len(lines))
                    self._written += len(lines)
                if unreported:  # after the lines written before the drops, where the dropped ones were
                    self._send(self._notice(unreported), 1)
            if self._closing:
                return

    def _send(self, data: bytes, lines: int) -> None:
        """Write ``data`` whole, waiting as long as the output is full; lines lost to a closed output are counted dropped."""
        view = memoryview(data)
        while view:
            try:
                # (the count bound first: compiled by mypyc, a slice of a memoryview evaluates its
                # bounds twice, which here would write the data twice)
                written = os.write(self.fd, view)
                view = view[written:]
            except BlockingIOError:  # an output opened non-blocking: wait until it takes more
                select.select([], [self.fd], [], 1.0)
            except OSError:  # closed or gone (EPIPE, EBADF): nothing to wait for
                with self._lock:
                    self.dropped += lines
                return

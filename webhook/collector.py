"""How often the cyclic garbage collector runs during gpu-admission's long runs (``serve``, ``audit``).

Reference counting frees nearly every object gpu-admission makes (a parsed
review, its evaluation, an answer); the cyclic collector only finds cycles.
With CPython's default young threshold (700 allocations) it still runs over
and over, each time walking whatever is alive at that moment:

- ``serve``: a 20-container pod's review is ~500 maps and lists, and its
  evaluation a few hundred more, so the young generation is collected once
  or more per admission, walking the request in flight (~2% of its CPU in
  docs/performance.md's paired rounds).
- ``audit``: a run holds every document it read and every result until the
  report is written, and each full pass walks all of them (a tenth of a
  10,000-document audit's time).

A young threshold of 10,000 keeps the collector for what it is for: the
cycles (failed TLS handshakes leave some, which the listener's stop also
collects itself), at a few MB of garbage at most between passes.

``serve`` sets 50,000 (``SERVE_YOUNG_THRESHOLD``). The young count is the
objects allocated less those freed since the last pass, and an admission's
review is parsed when its body is read, then waits for its turn
(``evaluation.Turns``): under load, a review from each connection is alive
at once. Twenty 20-container pods (20 connections, h2load's and
kube-apiserver's usual) are ~25,000 objects: with 10,000, the young
generation was collected every few admissions, each pass walking the
reviews in flight, and the survivors promoted to be walked again (13% of
the server's CPU on that pod, docs/performance.md). Garbage cycles, rare
in ``serve``, still go within 50,000 allocations.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 10_000
#: serve's: the reviews in flight stay below it (see above)
SERVE_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """The cyclic garbage collector runs less often inside (reference counting frees as before): its
    young threshold at least ``young``."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], young), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)

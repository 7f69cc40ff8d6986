"""The event loop `serve` runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv, TLS in Cython) takes 3-12% less CPU per admission request
than asyncio's pure-Python TLS transport, and a quarter less per trickled
TLS record from a slow client (docs/performance.md, docs/robustness.md).
``auto`` (the default) picks it when it imports, as uvicorn does;
``asyncio`` keeps the standard loop. Every slow-client and shutdown defence
is tested on both.

The loop is made by a factory handed to ``asyncio.Runner``, not by a
process-wide event loop policy: the policy API is deprecated from Python
3.14, and a policy would change the loop of every later ``asyncio.run`` in
the process too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from webhook.errors import GpuAdmissionError

CHOICES = ("auto", "uvloop", "asyncio")

_T = TypeVar("_T")


def factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a loop of ``name``; GpuAdmissionError when ``uvloop`` is asked and does not import."""
    if name == "asyncio":
        return _asyncio_loop
    try:
        import uvloop
    except ImportError as exc:  # a platform without a uvloop wheel, or a broken install
        if name == "auto":
            return _asyncio_loop
        raise GpuAdmissionError("--event-loop uvloop: uvloop is not installed on this platform") from exc
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, _T], loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> _T:
    """``asyncio.run(main)`` on a loop from ``loop_factory`` (``asyncio.run`` takes one from Python 3.12)."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


def _asyncio_loop() -> asyncio.AbstractEventLoop:
    """asyncio's own loop whatever policy is installed (``asyncio.EventLoop`` from Python 3.13)."""
    if sys.platform == "win32":
        return asyncio.ProactorEventLoop()
    return asyncio.SelectorEventLoop()

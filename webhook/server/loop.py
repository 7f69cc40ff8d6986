"""The event loop `serve` runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv, TLS in Cython) takes 3-12% less CPU per admission request
than asyncio's pure-Python TLS transport, and a quarter less per trickled
TLS record from a slow client (docs/performance.md, docs/robustness.md).
``auto`` (the default) picks it when it imports, as uvicorn does;
``asyncio`` keeps the standard loop. Every slow-client and shutdown defence
is tested on both.
"""

from __future__ import annotations

import asyncio

from webhook.errors import GpuAdmissionError

CHOICES = ("auto", "uvloop", "asyncio")


def use(name: str) -> None:
    """Make the loops ``asyncio.run`` creates from now on be of ``name`` (the startup line names it)."""
    if name == "asyncio":
        return
    try:
        import uvloop
    except ImportError as exc:  # a platform without a uvloop wheel, or a broken install
        if name == "auto":
            return
        raise GpuAdmissionError("--event-loop uvloop: uvloop is not installed on this platform") from exc
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

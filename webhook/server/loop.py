"""The event loop `serve` runs on: asyncio's own, or uvloop when asked for.

uvloop (libuv, TLS in Cython) takes ~10-15% less CPU per admission request
than asyncio's pure-Python TLS transport (docs/performance.md). It is
opt-in: asyncio's loop stays the default, and every slow-client defence is
tested on both.
"""

from __future__ import annotations

import asyncio

from webhook.errors import GpuAdmissionError

CHOICES = ("asyncio", "uvloop")


def use(name: str) -> None:
    """Make the loops ``asyncio.run`` creates from now on be of ``name``."""
    if name == "asyncio":
        return
    try:
        import uvloop
    except ImportError as exc:  # a platform without a uvloop wheel (it is a dependency elsewhere)
        raise GpuAdmissionError("--event-loop uvloop: uvloop is not installed on this platform") from exc
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

"""The event loop `serve` runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv, TLS in Cython) takes ~10-15% less CPU per admission request
than asyncio's pure-Python TLS transport, and a quarter less per trickled
TLS record from a slow client (docs/performance.md, docs/robustness.md).
``auto`` (the default) picks it when the platform has it, as uvicorn does;
``asyncio`` keeps the standard loop. Every slow-client and shutdown defence
is tested on both.
"""

from __future__ import annotations

import asyncio
import importlib.util

from webhook.errors import GpuAdmissionError

CHOICES = ("auto", "uvloop", "asyncio")


def resolve(name: str) -> str:
    """The loop ``name`` stands for here: ``auto`` is uvloop when it is installed."""
    if name == "auto":
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    return name


def use(name: str) -> str:
    """Make the loops ``asyncio.run`` creates from now on be of ``name``; the loop chosen."""
    chosen = resolve(name)
    if chosen == "asyncio":
        return chosen
    try:
        import uvloop
    except ImportError as exc:  # a platform without a uvloop wheel (it is a dependency elsewhere)
        raise GpuAdmissionError("--event-loop uvloop: uvloop is not installed on this platform") from exc
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return chosen

"""The TLS server of bench/server.py's floors: one review route and /readyz, as `serve` listens.

    serve(port, cert, key, event_loop, review)   # runs until the benchmark terminates its process
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


def serve(port: int, cert: str, key: str, event_loop: str, review: Callable[[Any], Awaitable[Any]]) -> None:
    """POST /mutate answered by ``review`` (an aiohttp handler), GET /readyz, over TLS with ``cert``
    and ``key``, on the event loop `serve --event-loop` picks; in a child process of the benchmark."""
    from aiohttp import web

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from webhook.server import loop

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/mutate", review)
        app.router.add_get("/readyz", ready)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
        await asyncio.Event().wait()  # until the benchmark terminates it

    loop.run(main(), loop.factory(event_loop))

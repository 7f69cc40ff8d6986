"""A server that answers every review with a fixed allow, behind the same listener as `serve`.

The slow-client soak measures it beside the real server, in the same run:
what the slow clients cost a server that does no work per request is what
the listener, TLS, the event loop and the machine cost, not the admission.

    python bench/null_server.py --port 8443 --tls-cert tls.crt --tls-key tls.key --header-timeout 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from webhook.errors import RequestBodyError  # noqa: E402
from webhook.server import keys, listener, loop  # noqa: E402
from webhook.server.body import read_body  # noqa: E402
from webhook.server.limits import Limits  # noqa: E402
from webhook.server.metrics import Metrics  # noqa: E402
from webhook.server.tls import ReloadingTLS  # noqa: E402


async def allow(request: web.Request) -> web.Response:
    """The body read as `serve` reads it (size limit, body timeout), then a fixed allow."""
    limits = Limits()
    try:
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout)
    except RequestBodyError as exc:
        return web.json_response({"message": str(exc)}, status=exc.status)
    uid = json.loads(body)["request"]["uid"]
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "response": {"uid": uid, "allowed": True}})


def app() -> web.Application:
    """What the listener needs of an app (its metrics, its draining flag), and one route."""
    null = web.Application()
    null[keys.METRICS] = Metrics()
    null[keys.DRAINING] = asyncio.Event()
    null.router.add_post("/validate", allow)
    return null


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--header-timeout", type=float, default=5.0)
    parser.add_argument("--event-loop", choices=loop.CHOICES, default="auto", help="as `serve --event-loop`")
    args = parser.parse_args()
    tls = ReloadingTLS(Path(args.tls_cert), Path(args.tls_key), None)
    config = listener.ListenerConfig(host="127.0.0.1", port=args.port, header_timeout=args.header_timeout)
    # the same loop as `serve`, else the two arms compare event loops
    loop.run(listener.serve(app(), config, tls.context, drain=0.0, timeout=15.0), loop.factory(args.event_loop))


if __name__ == "__main__":
    main()

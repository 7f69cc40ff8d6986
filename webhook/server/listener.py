"""The TLS listener: per-connection guards, and a stop that loses no request.

aiohttp's own server has no read timeout for request headers (a client that
sends half a request line holds its connection until the keep-alive limit),
no cap on connections, and on shutdown closes keep-alive connections while a
client may be sending on them. The listener below adds those guards to
aiohttp's request handler and drains before it stops:

1. ``/readyz`` turns 503 and every answer carries ``Connection: close``
   (``drain`` seconds): endpoints are removed while the server still serves,
   and each client moves its next request to a new connection;
2. the listening socket closes (new connections are refused at connect);
3. connections still open are answered to the end, then closed once idle
   and quiet (no byte received for ``QUIET_SECONDS``, none waiting unread), within the timeout;
   a connection accepted before the listener closed whose TLS handshake is
   still under way (common under load: each drained answer sends its client
   to a new connection) is waited for too, up to the handshake timeout.

Neither asyncio's nor uvloop's TLS transport tells the connection's protocol
that its handshake failed (or that a TCP probe closed before it began): the
protocol's ``connection_made`` was never called, so its ``connection_lost``
is not either. The transport drops its reference, and the handler is left
held only by its own HTTP parser, a cycle the garbage collector frees. The
stop therefore runs the collector while such connections are pending, rather
than wait the handshake timeout for connections that are gone.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl
import sys
import weakref
from asyncio import sslproto
from dataclasses import dataclass, field, replace
from typing import Any

from http import HTTPStatus

try:  # (POSIX: the bytes a socket holds unread; elsewhere an idle connection is closed as aiohttp does)
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from aiohttp import StreamReader, web, web_protocol
from aiohttp.web_request import BaseRequest

from webhook import logs, review
from webhook.errors import GpuAdmissionError
from webhook.server import handlers, keys
from webhook.server.tls import peer_names

log = logging.getLogger(__name__)

#: asyncio gives every TLS connection a 256 KiB read buffer (SSLProtocol.max_size),
#: the better part of what an idle connection costs. TLS records hold at most
#: 16 KiB, so a smaller buffer reads a 3 MiB review in a few more steps and
#: nothing else changes. Process-wide: set by ``start``, i.e. by the server. asyncio's loop
#: only: uvloop allocates its own buffer per connection but does not touch it while idle.
TLS_READ_BUFFER = 32 * 1024

#: a TLS close (idle timeout, 408, connection cap, shutdown) sends close_notify and waits this
#: long for the client's before dropping the socket (asyncio's and uvloop's default: 30 s)
SSL_SHUTDOWN_TIMEOUT = 2.0

#: a parked connection is read once more this long before its head's deadline: a head it
#: finished meanwhile is answered, else the connection is dropped at the deadline
PARKED_GRACE = 0.25

#: a connection with no byte received for this long, and no request in
#: progress, can be closed at shutdown without cutting a request in flight
QUIET_SECONDS = 0.5

#: at shutdown, while connections mid-handshake are pending, the garbage collector runs this
#: often to free those whose handshake failed: the young generations, then the whole heap if some
#: remain. A full collection: ~0.3 ms once serve has moved what was alive at its start and its
#: synced cluster view out of the collector's scans (gc.freeze), more as later relists add objects
#: (~75 ms over the 85,000 objects of a server without a cluster view, unfrozen), a pause of the
#: loop that answers what is in flight
COLLECT_SECONDS = 1.0

#: an idle connection found with bytes the loop has not read yet is looked at again this much later
IDLE_RECHECK = 1.0

#: connections open at once on the plain metrics port (``metrics_port``): a scraper or two, and probes
METRICS_CONNECTIONS = 64


@dataclass(frozen=True)
class ListenerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    #: from the first byte of a request head to its last header line (a connection that has sent
    #: nothing yet is idle: ``idle_timeout``)
    header_timeout: float = 5.0
    #: a request head still incomplete this long after its first byte is trickling in (a real
    #: client sends its head at once; a lost TCP segment is resent well within a second): its
    #: connection is parked, not read again until the head's deadline, so a slowloris client
    #: costs a few wakeups instead of one per record (0: never park)
    trickle: float = 1.0
    #: a connection idle this long (no request since the last answer, or none since it was opened) is
    #: closed. Longer than kube-apiserver's client keeps an idle connection (90 s, Go's net/http
    #: default), so that it is the client that closes: a close from this side can cross a request
    #: the client has just sent, which fails with "EOF" (kube-apiserver retries no webhook POST)
    idle_timeout: float = 120.0
    handshake_timeout: float = 5.0
    max_connections: int = 1000
    #: after an early answer (413, 408) the rest of a body is read and dropped for this long
    lingering: float = 2.0
    backlog: int = 512
    #: the client identities accepted (a verified client certificate's subject common name or a DNS, IP
    #: or URI subject alternative name, ``--client-name``); empty: any certificate the client CA signed.
    #: A connection from any other is closed once its handshake is done, before a byte of HTTP is read.
    client_names: frozenset[str] = field(default_factory=frozenset)
    #: serve /metrics, /healthz and /readyz (only those) in plain HTTP on this port too, on ``host``
    #: (``--metrics-port``); None: none. The TLS port then no longer serves /metrics (the app's config).
    metrics_port: int | None = None


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """How many bytes the client sent that wait in the kernel, not read by the loop yet (0 if unknown).

    An event loop busy past a connection's idle deadline may run the deadline's timer before it
    reads what came meanwhile (uvloop runs due timers after its poll's callbacks and before its
    next poll): a request sent in time would find its connection closed. A system call, made
    only when an idle connection is about to be closed."""
    sock = transport.get_extra_info("socket")
    if sock is None or fcntl is None:
        return 0
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), sys.byteorder, signed=True)
    except (OSError, ValueError):  # (a socket closed meanwhile, a platform without FIONREAD)
        return 0


class CloseLog:
    """One INFO line a second for the connections closed at their header timeout, with how many.

    A slowloris attack closes hundreds of connections within milliseconds: one line each
    would write hundreds of lines at once on the event loop, and flood the logs."""

    def __init__(self, timeout: float, interval: float = 1.0) -> None:
        self._timeout = timeout
        self._interval = interval
        self._pending = 0
        self._flush: asyncio.TimerHandle | None = None

    def closed(self) -> None:
        if self._flush is None:
            log.info("closing a connection that sent no complete request head in %g s", self._timeout)
            self._flush = asyncio.get_running_loop().call_later(self._interval, self._write)
        else:
            self._pending += 1

    def _write(self) -> None:
        if self._pending:
            log.info("closed %d more connections that sent no complete request head in %g s (in %g s)",
                     self._pending, self._timeout, self._interval)
            self._pending = 0
            self._flush = asyncio.get_running_loop().call_later(self._interval, self._write)
        else:
            self._flush = None


class _Refusals:
    """A WARNING line for each new set of refused client names, DEBUG for its repeats (a client
    retrying at once must not flood the logs; its names come from a certificate the client CA
    signed, so the sets are few)."""

    def __init__(self, remembered: int = 64) -> None:
        self._seen: set[frozenset[str]] = set()
        self._remembered = remembered

    def refused(self, names: frozenset[str]) -> None:
        shown = ", ".join(sorted(names)) or "no name"
        if names in self._seen:
            log.debug("refused a client certificate naming %s: not a --client-name", shown)
            return
        if len(self._seen) < self._remembered:
            self._seen.add(names)
        log.warning("refused a client certificate naming %s: not a --client-name (its connection is closed "
                    "after the handshake)", shown)


_refusals = _Refusals()


class GuardedHandler(web_protocol.RequestHandler):
    """aiohttp's request handler with a header timeout, a connection cap and activity tracking."""

    def __init__(
        self, manager: web.Server, *, config: ListenerConfig, app: web.Application, closes: CloseLog,
        handshaking: weakref.WeakSet[GuardedHandler], **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._config = config
        self._app = app
        self._closes = closes
        self._header_timer: asyncio.TimerHandle | None = None
        self.last_activity = self.accepted_at = self._loop.time()
        #: the request head under way has sent its first byte (its trickle time runs from then)
        self._head_started = False
        self._head_deadline = self.accepted_at + config.header_timeout  # (set again when the timer is armed)
        self._park_timer: asyncio.TimerHandle | None = None
        #: the current head is parked: its socket not read until just before its deadline
        self._parked = False
        #: the body of the last request received, until it is read to its end
        self._body: StreamReader | None = None
        self._counted = False
        # accepted, TLS handshake under way: not in the server's connections until it is made
        self._handshaking = handshaking
        handshaking.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handshaking.discard(self)
        super().connection_made(transport)
        loop = asyncio.get_running_loop()
        self.last_activity = loop.time()
        server = self._manager
        if server is not None and len(server.connections) > self._config.max_connections:
            self._app[keys.METRICS].reject("connection-cap")
            self.force_close()
            return
        if self._config.client_names and not self._client_accepted(transport):
            self._app[keys.METRICS].reject("client-name")
            if self.transport is not None:  # (no close_notify exchange: nothing was said, nothing is owed)
                self.transport.abort()
            self.force_close()
            return
        self._app[keys.METRICS].connections.inc()
        self._counted = True
        # nothing sent yet: idle, not a head under way (kube-apiserver's client, Go's net/http, keeps a
        # connection it dialled and did not need for its next request). aiohttp's idle timer from
        # here, where its version does not arm it itself
        if self._keepalive_handle is None and self._keepalive_timeout:
            self._keepalive_handle = self._loop.call_at(self._loop.time() + self._keepalive_timeout,
                                                        self._process_keepalive)

    def _process_keepalive(self) -> None:
        """aiohttp's idle close, unless the connection is not idle after all: the client sent bytes
        the loop has not read yet (``unread_bytes``), or a request head is under way (its header
        timeout ends it). Looked at again ``IDLE_RECHECK`` later then; an answer restarts the idle time."""
        transport = self.transport
        if transport is not None and not self._force_close and (
            self._header_timer is not None or self._parked or unread_bytes(transport)
        ):
            self._keepalive_handle = self._loop.call_at(self._loop.time() + IDLE_RECHECK, self._process_keepalive)
            return
        super()._process_keepalive()

    def _client_accepted(self, transport: asyncio.BaseTransport) -> bool:
        """The verified client certificate names one of ``client_names`` (without one: refused)."""
        ssl_object = transport.get_extra_info("ssl_object")
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        names = peer_names(cert) if cert else frozenset()
        if names & self._config.client_names:
            return True
        _refusals.refused(names)
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        if self._park_timer is not None:
            self._park_timer.cancel()
        if self._counted:
            self._app[keys.METRICS].connections.dec()
            self._counted = False
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.last_activity = now = self._loop.time()
        body = self._body
        in_body = body is not None and not body.is_eof()
        super().data_received(data)
        messages = self._messages
        if messages:
            self._body = messages[-1][1]
        if messages or self._request_in_progress:
            self._disarm_header_timer()
            return
        if in_body or not data:
            # (the end of) a body aiohttp reads after an answer that did not read it, its lingering
            # read bounded by ``lingering``, or no byte at all (aiohttp's resume_reading feeds the
            # parser b""): no request head under way
            return
        self._body = None
        if self._header_timer is None:
            self._arm_header_timer()
        if self._head_started:
            return
        # the head's first byte (the trickle time runs from it, not from the connect: a client
        # may connect early); parked at the end of the trickle time if the head is not whole by
        # then, without waiting for another record to read
        self._head_started = True
        trickle = self._config.trickle
        if 0 < trickle and now + trickle < self._head_deadline - PARKED_GRACE:
            self._park_timer = self._loop.call_at(now + trickle, self._park)

    def _park(self) -> None:
        """Read no more of a trickling head until just before its deadline: what it sends waits in the kernel.

        Over TLS, pausing the application's reading alone would not stop the socket's
        (records would still be read and decrypted one by one): a read buffer limit of
        zero pauses the socket too, as both event loops' TLS transports document."""
        self._park_timer = None
        transport = self.transport
        if transport is None:
            return
        self._parked = True
        self._app[keys.METRICS].parked.inc()
        transport.pause_reading()
        if hasattr(transport, "set_read_buffer_limits"):
            transport.set_read_buffer_limits(high=0)
        if self._header_timer is not None:  # read again PARKED_GRACE before the deadline
            self._header_timer.cancel()
            self._header_timer = self._loop.call_at(self._head_deadline - PARKED_GRACE, self._header_timeout)

    def _unpark(self) -> None:
        transport = self.transport
        self._parked = False
        if transport is None:
            return
        if hasattr(transport, "set_read_buffer_limits"):
            transport.set_read_buffer_limits()
        if not (self._reading_paused or self._buffer_paused):  # (aiohttp's own flow control keeps its pause)
            transport.resume_reading()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse, as a Status body like every other 4xx."""
        response = super().handle_error(request, status, exc, message)
        if not 400 <= status < 500:
            return response
        text = " ".join((message or HTTPStatus(status).phrase).split())[:300]
        response = web.json_response(review.error_body(f"malformed HTTP request: {text}"), status=status)
        response.force_close()
        return response

    def idle(self) -> bool:
        """No request received, queued or being answered."""
        return not self._messages and not self._request_in_progress

    def _arm_header_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_deadline = loop.time() + self._config.header_timeout
        self._header_timer = loop.call_at(self._head_deadline, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._park_timer is not None:
            self._park_timer.cancel()
            self._park_timer = None
        if self._parked:  # (a head completed while parked: read on as usual)
            self._unpark()
        self._head_started = False

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._parked:
            # what the client sent while parked is read now; a head it completed is answered
            self._unpark()
            self._header_timer = self._loop.call_at(self._head_deadline, self._header_timeout)
            return
        if self.idle() and self.transport is not None:
            self._app[keys.METRICS].reject("header-timeout")
            self._closes.closed()
            # dropped, not closed: a TLS close waits up to SSL_SHUTDOWN_TIMEOUT for the client's
            # close_notify, which a slowloris client never sends, holding the socket and its
            # buffers; there is no request to answer (connection_lost follows and cleans up)
            self.transport.abort()


class GuardedSite(web.BaseSite):
    """A TCP+TLS site whose connections are GuardedHandlers."""

    __slots__ = ("_config", "_app", "port", "handshaking")

    def __init__(self, runner: web.AppRunner, config: ListenerConfig, ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=config.backlog)
        self._config = config
        self._app = runner.app
        self.port = config.port
        #: connections accepted whose TLS handshake is not done; a failed one leaves when the garbage
        #: collector frees it (its parser refers back to it): Listener.stop runs the collector
        self.handshaking: weakref.WeakSet[GuardedHandler] = weakref.WeakSet()

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._config.host}:{self.port}"

    @property
    def handshake_timeout(self) -> float:
        return self._config.handshake_timeout

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        config, app = self._config, self._app
        closes, handshaking = CloseLog(config.header_timeout), self.handshaking

        def protocol() -> GuardedHandler:
            return GuardedHandler(
                server, loop=loop, config=config, app=app, closes=closes, handshaking=handshaking,
                keepalive_timeout=config.idle_timeout,
                access_log=None, auto_decompress=False, lingering_time=config.lingering,
            )

        self._server = await loop.create_server(
            protocol, config.host, config.port, ssl=self._ssl_context, backlog=config.backlog,
            ssl_handshake_timeout=config.handshake_timeout if self._ssl_context else None,
            ssl_shutdown_timeout=SSL_SHUTDOWN_TIMEOUT if self._ssl_context else None, reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]


class Listener:
    """A running server: its app, runner and site, and the way it stops."""

    def __init__(self, runner: web.AppRunner, site: GuardedSite,
                 metrics: tuple[web.AppRunner, GuardedSite] | None = None) -> None:
        self.runner = runner
        self.site = site
        #: the plain metrics port's runner and site (``ListenerConfig.metrics_port``)
        self.metrics = metrics

    @property
    def port(self) -> int:
        return self.site.port

    @property
    def metrics_port(self) -> int | None:
        return self.metrics[1].port if self.metrics is not None else None

    async def stop(self, drain: float = 0.0, timeout: float = 15.0) -> None:
        """Drain, stop listening, answer what is in flight, then close; within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.runner.app[keys.DRAINING].set()
        await asyncio.sleep(max(0.0, min(drain, timeout - 1.0)))
        await self.site.stop()
        collected = -COLLECT_SECONDS
        while loop.time() < deadline - 0.5:
            if self.site.handshaking and loop.time() - collected >= COLLECT_SECONDS:
                # frees the handlers of failed handshakes (see the module's docstring): they are at
                # most a handshake timeout old, so the young generations first; the whole heap
                # (which grows unfrozen with every relist since the first sync) only if some are left
                gc.collect(1)
                if self.site.handshaking:
                    gc.collect()
                collected = loop.time()
            if not self._busy(loop.time()):
                break
            await asyncio.sleep(0.05)
        await self.runner.cleanup()
        if self.metrics is not None:  # (last: a scrape during the drain sees it, /readyz 503 there too)
            await self.metrics[0].cleanup()

    def _busy(self, now: float) -> bool:
        """A request may still come or is being answered: on a connection mid-handshake (accepted
        before the listener closed, its request not sent yet), or one not idle and quiet."""
        handshake = self.site.handshake_timeout
        if any(now - c.accepted_at < handshake for c in self.site.handshaking):
            return True
        server = self.runner.server
        if server is None:
            return False
        return any(
            not (isinstance(c, GuardedHandler) and c.idle() and now - c.last_activity >= QUIET_SECONDS
                 and not (c.transport is not None and unread_bytes(c.transport)))
            for c in server.connections
        )


async def start(app: web.Application, config: ListenerConfig, ssl_context: ssl.SSLContext | None) -> Listener:
    """Start ``app`` (its startup and cleanup contexts) behind a guarded listener."""
    logs.quiet_protocol_errors()
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
        sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    assert runner.server is not None
    runner.server.request_handler = handlers.dispatch(app)  # (before the site makes its first connection)
    site = GuardedSite(runner, config, ssl_context)
    plain: web.AppRunner | None = None
    try:
        await site.start()
        if config.metrics_port is None:
            return Listener(runner, site)
        plain = web.AppRunner(metrics_app(app), handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await plain.setup()
        plain_config = replace(config, port=config.metrics_port, max_connections=METRICS_CONNECTIONS,
                               client_names=frozenset(), metrics_port=None)
        plain_site = GuardedSite(plain, plain_config, None)
        await plain_site.start()
        return Listener(runner, site, (plain, plain_site))
    except BaseException:
        # (a port taken, say): what the startup began (watches, the quota ledger's writers, worker
        # threads) is stopped here, in order, while the loop still runs, not left to the loop's
        # teardown, which cancels the tasks first and may wait on what they were to stop
        if plain is not None:
            await plain.cleanup()
        await runner.cleanup()
        raise


def metrics_app(app: web.Application) -> web.Application:
    """The plain-HTTP face of ``app``: /metrics, /healthz and /readyz on its state, nothing else (404)."""
    plain = web.Application()
    plain[keys.METRICS] = app[keys.METRICS]
    plain[keys.DRAINING] = app[keys.DRAINING]
    plain[keys.READY_CHECKS] = app[keys.READY_CHECKS]  # (the same list: the cluster index adds its check later)
    plain.router.add_get("/metrics", handlers.metrics)
    plain.router.add_get("/healthz", handlers.healthz)
    plain.router.add_get("/readyz", handlers.readyz)
    return plain


async def serve(app: web.Application, config: ListenerConfig, ssl_context: ssl.SSLContext | None, *, drain: float,
                timeout: float) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then drain and stop within ``timeout`` seconds."""
    try:
        running = await start(app, config, ssl_context)
    except OSError as exc:
        raise GpuAdmissionError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
    loop = asyncio.get_running_loop()
    log.info("serving on https://%s:%d (event loop: %s)", config.host, running.port,
             "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio")
    if running.metrics_port is not None:
        log.info("serving /metrics, /healthz and /readyz on http://%s:%d", config.host, running.metrics_port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: not ready, serving for %g s more, then answering what is in flight (at most %g s in all)", drain, timeout)
    await running.stop(drain=drain, timeout=timeout)
    log.info("stopped")

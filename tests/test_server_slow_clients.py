"""Slow and idle clients: header and body timeouts, a connection cap; normal requests keep flowing."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time

import pytest
from typing import Any

from tests.conftest import ON_UVLOOP, Pki, StartWebhook, Webhook
from tests.support import corpus_reviews, load_review
from webhook.server import keys, listener
from webhook.server.limits import Limits

GUARDED = listener.ListenerConfig(host="127.0.0.1", port=0, header_timeout=0.5, trickle=0.2, max_connections=40)


def port_of(hook: Webhook) -> int:
    return int(hook.base.rsplit(":", 1)[1])


async def connect(port: int, ctx: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sent before closing (a reset, a connection dropped with data still
    unread on the server's side, counts as closed with nothing sent); fails if it is still open
    after ``within`` s."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except ConnectionResetError:
        return b""


async def slowloris(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await connect(port, ctx)
    writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
    for n in range(100):  # a header line now and then, never the blank line that ends them
        if reader.at_eof():
            break
        try:
            writer.write(f"X-{n}: y\r\n".encode())
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            break
        await asyncio.sleep(0.1)
    return await closed_by_server(reader, 5)


async def slow_body(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await connect(port, ctx)
    writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    await writer.drain()
    return await closed_by_server(reader, 5)


async def test_the_loop_is_the_one_this_module_is_collected_for(request: pytest.FixtureRequest) -> None:
    """Here asyncio's own; collected again in test_server_uvloop.py, uvloop's (conftest's loop factories)."""
    expected = "uvloop" if request.node.path.name in ON_UVLOOP else "asyncio"
    assert type(asyncio.get_running_loop()).__module__.split(".")[0] == expected


async def test_slow_headers_and_bodies_are_cut_off_while_others_are_served(start_webhook: StartWebhook, pki: Pki) -> None:
    hook = await start_webhook(listen=GUARDED, limits=Limits(body_timeout=0.5))
    port, ctx = port_of(hook), pki.client_context()
    sent = load_review(corpus_reviews()[1])
    slow = [asyncio.create_task(slowloris(port, ctx)) for _ in range(10)]
    slow += [asyncio.create_task(slow_body(port, ctx)) for _ in range(5)]
    answered = 0
    while not all(t.done() for t in slow):
        assert (await hook.review("/validate", sent))["response"]["uid"] == sent["request"]["uid"]
        answered += 1
    results = await asyncio.gather(*slow)
    assert all(r == b"" for r in results[:10]), "a request head that never ends gets no answer, just a close"
    for raw in results[10:]:
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
        assert json.loads(body)["kind"] == "Status"
    metrics = hook.app[keys.METRICS]
    assert metrics.rejected.labels("header-timeout")._value.get() == 10
    assert metrics.rejected.labels("body-timeout")._value.get() == 5
    assert metrics.parked._value.get() >= 1, "trickling heads are parked until their deadline"
    assert answered > 0


def read_limits(hook: Webhook) -> list[tuple[int, int]]:
    """The read-buffer limits of the server's TLS transport of each open connection."""
    assert hook.listener is not None and hook.listener.runner.server is not None
    # (a TLS transport's method: asyncio's and uvloop's _SSLProtocolTransport)
    transports: list[Any] = [c.transport for c in hook.listener.runner.server.connections if c.transport]
    return [t.get_read_buffer_limits() for t in transports]


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP response's head and body, as the server sent them."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")).split(b":")[1])
    return head, await reader.readexactly(length)


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, Any]]:
    head, body = await read_response(reader)
    return head, json.loads(body)


def request(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        path.encode(), len(body)) + body


async def test_a_trickling_head_is_read_again_at_its_deadline_and_answered_if_it_was_completed(
    start_webhook: StartWebhook, pki: Pki
) -> None:
    """A head still incomplete after the trickle time is not read until just before its deadline:
    its socket is paused too (a TLS read limit of zero), so a slowloris client costs no wakeup per
    record; a head the client finished meanwhile is answered then, and the connection reads on."""
    # (the head's 0.5 s of trickling leaves its deadline, 3 s, far off on a loaded machine)
    config = listener.ListenerConfig(host="127.0.0.1", port=0, header_timeout=3.0, trickle=0.2)
    hook = await start_webhook(listen=config)
    sent = load_review(corpus_reviews()[1])
    whole = request("/validate", json.dumps(sent).encode())
    reader, writer = await connect(port_of(hook), pki.client_context())
    loop = asyncio.get_running_loop()
    started = loop.time()
    head, _, rest = whole.partition(b"\r\n")
    writer.write(head + b"\r\n")
    for n in range(5):  # a header line every 0.1 s: parked after the 0.2 s
        await asyncio.sleep(0.1)
        writer.write(f"X-{n}: y\r\n".encode())
        await writer.drain()
    assert read_limits(hook) == [(0, 0)], "parked: the socket itself is not read"
    writer.write(rest)
    await writer.drain()
    head_in, answer = await read_answer(reader)
    answered_after = loop.time() - started
    assert head_in.startswith(b"HTTP/1.1 200")
    assert answer["response"]["uid"] == sent["request"]["uid"]
    # its last bytes came at ~0.5 s; read again only just before the deadline (3 s from its first byte)
    assert answered_after >= config.header_timeout - listener.PARKED_GRACE - 0.1, f"answered after {answered_after:.2f} s: not parked"
    assert read_limits(hook) != [(0, 0)], "unparked: the socket's read limits are back"
    writer.write(whole)  # the same connection serves its next request as any other
    await writer.drain()
    head_in, answer = await read_answer(reader)
    assert head_in.startswith(b"HTTP/1.1 200") and answer["response"]["uid"] == sent["request"]["uid"]
    assert hook.app[keys.METRICS].parked._value.get() == 1
    assert hook.app[keys.METRICS].rejected.labels("header-timeout")._value.get() == 0
    writer.close()


async def test_the_rest_of_a_body_read_after_its_answer_is_no_request_head(start_webhook: StartWebhook, pki: Pki) -> None:
    """An answer that did not read its body (a 404 here) is followed by aiohttp reading and dropping
    the rest (its lingering read): a body sent slowly then is neither parked as a trickling head nor
    timed out as one, and the connection serves its next request."""
    config = listener.ListenerConfig(host="127.0.0.1", port=0, header_timeout=0.8, trickle=0.2, lingering=20.0)
    hook = await start_webhook(listen=config)
    reader, writer = await connect(port_of(hook), pki.client_context())
    body = b"x" * 20_000
    writer.write(request("/nowhere", body)[: -len(body)] + body[:1000])
    await writer.drain()
    head_in, _ = await read_response(reader)
    assert head_in.startswith(b"HTTP/1.1 404")
    for offset in range(1000, len(body), 1000):  # the rest over ~1.9 s, past the trickle time and the header timeout
        await asyncio.sleep(0.1)
        writer.write(body[offset : offset + 1000])
        await writer.drain()
    await asyncio.sleep(config.header_timeout + 0.2)  # idle past a header timeout a lingering read would have armed
    sent = load_review(corpus_reviews()[1])
    writer.write(request("/validate", json.dumps(sent).encode()))
    await writer.drain()
    head_in, answer = await read_answer(reader)
    assert head_in.startswith(b"HTTP/1.1 200") and answer["response"]["uid"] == sent["request"]["uid"]
    metrics = hook.app[keys.METRICS]
    assert metrics.parked._value.get() == 0
    assert metrics.rejected.labels("header-timeout")._value.get() == 0
    writer.close()


async def test_a_head_sent_whole_is_never_parked(start_webhook: StartWebhook, pki: Pki) -> None:
    hook = await start_webhook(listen=GUARDED)
    sent = load_review(corpus_reviews()[1])
    for _ in range(5):
        assert (await hook.review("/validate", sent))["response"]["uid"] == sent["request"]["uid"]
    assert hook.app[keys.METRICS].parked._value.get() == 0


async def test_connections_past_the_cap_are_closed_at_once(start_webhook: StartWebhook, pki: Pki) -> None:
    hook = await start_webhook(listen=listener.ListenerConfig(host="127.0.0.1", port=0, max_connections=3))
    port, ctx = port_of(hook), pki.client_context()
    held = [await connect(port, ctx) for _ in range(3)]
    reader, _ = await connect(port, ctx)
    assert await closed_by_server(reader, 5) == b""
    assert hook.app[keys.METRICS].rejected.labels("connection-cap")._value.get() == 1
    for _, writer in held:
        writer.close()
    for _ in range(100):  # the server sees the closes
        if hook.app[keys.METRICS].connections._value.get() == 0:
            break
        await asyncio.sleep(0.02)
    async with hook.session.get(hook.base + "/healthz") as resp:
        assert resp.status == 200


async def test_a_connection_that_never_sends_is_closed_at_the_idle_timeout(start_webhook: StartWebhook, pki: Pki) -> None:
    """A new connection that sends nothing is idle, as a kept-alive one between requests is: closed at
    the idle timeout, not at the header timeout (which runs from a head's first byte)."""
    config = listener.ListenerConfig(host="127.0.0.1", port=0, header_timeout=0.3, trickle=0.1, idle_timeout=1.5)
    hook = await start_webhook(listen=config)
    loop = asyncio.get_running_loop()
    reader, _ = await connect(port_of(hook), pki.client_context())
    opened = loop.time()
    assert await closed_by_server(reader, 10) == b""
    assert loop.time() - opened >= config.idle_timeout - 0.05, "closed before its idle timeout"
    assert hook.app[keys.METRICS].rejected.labels("header-timeout")._value.get() == 0


async def test_a_connection_opened_ahead_of_need_serves_its_first_request_after_the_header_timeout(
    start_webhook: StartWebhook, pki: Pki
) -> None:
    """kube-apiserver's client (Go's net/http) dials a connection for a request and, when another frees
    up first, keeps the new one idle for a later request: that request is answered, however long
    after the header timeout it comes (dropped at the header timeout, such a connection made the next
    request fail with EOF). The control: a head begun and not finished is still dropped at it."""
    hook = await start_webhook(listen=GUARDED)
    sent = load_review(corpus_reviews()[1])
    reader, writer = await connect(port_of(hook), pki.client_context())
    await asyncio.sleep(GUARDED.header_timeout * 3)
    writer.write(request("/validate", json.dumps(sent).encode()))
    head, answer = await read_answer(reader)
    assert head.startswith(b"HTTP/1.1 200") and answer["response"]["uid"] == sent["request"]["uid"]
    writer.close()
    assert hook.app[keys.METRICS].rejected.labels("header-timeout")._value.get() == 0
    assert await slowloris(port_of(hook), pki.client_context()) == b""
    assert hook.app[keys.METRICS].rejected.labels("header-timeout")._value.get() == 1


async def test_a_request_that_came_while_the_loop_was_busy_past_the_idle_deadline_is_answered(
    start_webhook: StartWebhook, pki: Pki
) -> None:
    """The client sent its next request before the idle deadline and the loop, busy, reached the
    deadline before it read the socket (uvloop runs due timers before it polls): the request is
    answered, not met with a close (what kube-apiserver reports as "failed calling webhook: EOF").
    The control: the same connection left idle is closed at its idle timeout."""
    config = listener.ListenerConfig(host="127.0.0.1", port=0, idle_timeout=0.5)
    hook = await start_webhook(listen=config)
    sent = load_review(corpus_reviews()[1])
    whole = request("/validate", json.dumps(sent).encode())
    # a blocking client: what it sends is in the server's socket at once, whatever the loop does
    sock = await asyncio.to_thread(blocking_connection, port_of(hook), pki.client_context())
    try:
        sock.sendall(whole)
        assert (await asyncio.to_thread(blocking_answer, sock)).startswith(b"HTTP/1.1 200")
        # the loop busy reading (a burst of TLS handshakes, say) past the idle deadline while the request comes
        loop, (ready, poke) = asyncio.get_running_loop(), socket.socketpair()
        done = loop.create_future()

        def busy() -> None:
            loop.remove_reader(ready)
            sock.sendall(whole)
            time.sleep(config.idle_timeout + 0.3)
            done.set_result(None)

        loop.add_reader(ready, busy)
        poke.send(b"!")
        await done  # (the socket read only then: one thread at a time on a TLS socket)
        answer = await asyncio.to_thread(blocking_answer, sock)
        assert answer.startswith(b"HTTP/1.1 200") and sent["request"]["uid"].encode() in answer, answer[:200]
        sock.settimeout(10)  # the control: left idle, closed at the idle timeout
        assert await asyncio.to_thread(sock.recv, 1) == b""
    finally:
        sock.close()
        ready.close()
        poke.close()


def blocking_connection(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
    sock.settimeout(5)
    return sock


def blocking_answer(sock: ssl.SSLSocket) -> bytes:
    """One whole HTTP response read from a blocking socket (b"" if the server closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")).split(b":")[1])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def silent_slowloris(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    """A blocking TLS socket that sends half a request line and then never reads: it never
    answers the server's close_notify, as a slowloris tool on raw sockets does not."""
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
    sock.sendall(b"POST /validate HTTP/1.1\r\n")
    return sock


async def test_a_slowloris_client_that_never_reads_loses_its_socket_at_the_header_timeout(
    start_webhook: StartWebhook, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TLS close waits for the client's close_notify (30 s by default in asyncio and uvloop);
    a connection dropped at its header timeout must not wait for a client that never reads.
    (That wait is made asyncio's 30 s here, so that half of it is a margin any machine keeps.)"""
    monkeypatch.setattr(listener, "SSL_SHUTDOWN_TIMEOUT", 30.0)
    hook = await start_webhook(listen=GUARDED)
    socks = [await asyncio.to_thread(silent_slowloris, port_of(hook), pki.client_context()) for _ in range(5)]
    open_connections = hook.app[keys.METRICS].connections
    assert open_connections._value.get() == 5
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARDED.header_timeout + listener.SSL_SHUTDOWN_TIMEOUT / 2
    while open_connections._value.get() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert open_connections._value.get() == 0, "the server still holds sockets past the header timeout"
    assert hook.app[keys.METRICS].rejected.labels("header-timeout")._value.get() == 5
    for sock in socks:
        sock.close()


async def test_header_timeout_closes_are_logged_once_a_second_with_their_count(caplog: pytest.LogCaptureFixture) -> None:
    closes = listener.CloseLog(timeout=5.0, interval=0.05)
    with caplog.at_level(logging.INFO, logger=listener.__name__):
        for _ in range(10):  # a slowloris wave: all within one interval
            closes.closed()
        await asyncio.sleep(1.0)  # (twenty intervals: the flush and its quiet check have run, however loaded)
        closes.closed()  # a quiet interval has passed: logged at once again
    lines = [r.getMessage() for r in caplog.records if r.name == listener.__name__]
    assert lines == [
        "closing a connection that sent no complete request head in 5 s",
        "closed 9 more connections that sent no complete request head in 5 s (in 0.05 s)",
        "closing a connection that sent no complete request head in 5 s",
    ]


async def test_a_head_that_stops_arriving_is_parked_at_the_end_of_its_trickle_time(
    start_webhook: StartWebhook, pki: Pki
) -> None:
    """Parked by the clock, not by the next record read: a client that sent half a head and then
    nothing has its socket paused once the trickle time is over."""
    config = listener.ListenerConfig(host="127.0.0.1", port=0, header_timeout=30.0, trickle=0.5)
    hook = await start_webhook(listen=config)
    reader, writer = await connect(port_of(hook), pki.client_context())
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    # no other record is sent: only the clock can park it, and long before its head's deadline
    while read_limits(hook) != [(0, 0)]:
        assert loop.time() - sent_at < config.header_timeout - listener.PARKED_GRACE, "never parked"
        await asyncio.sleep(0.02)
    parked_after = loop.time() - sent_at
    # (a bound no load can break: the head's first byte came after sent_at, its trickle time after that)
    assert parked_after >= config.trickle, f"parked {parked_after:.2f} s after its first byte: before its trickle time"
    assert hook.app[keys.METRICS].parked._value.get() == 1
    writer.close()


async def test_a_client_that_sends_and_never_reads_is_not_answered_into_an_unbounded_buffer(
    webhook: Webhook, pki: Pki
) -> None:
    """Requests pipelined on one connection whose answers are never read: once the server's
    write buffer is full it stops reading the connection (handlers.Answer waits while the
    transport is paused, as aiohttp's own responses do), so the client's sending stalls too."""
    body = json.dumps(load_review(corpus_reviews()[0])).encode()
    one = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    reader, writer = await connect(port_of(webhook), pki.client_context())
    writer.transport.pause_reading()  # type: ignore[attr-defined]  # (the client never reads its answers)
    try:
        for sent in range(1, 20_001):
            writer.write(one)
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except TimeoutError:
                break  # the server stopped reading
        # each answer is ~1.3 KB: 20,000 would be ~26 MB held by the server for one connection
        assert sent < 20_000, "the server took every request while none of its answers was read"
    finally:
        writer.transport.abort()

"""Graceful stop of a real `gpu-admission serve` process under keep-alive load: nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import Pki
from tests.support import REPO, corpus_reviews, listening_port, load_review
from webhook import cli
from webhook.server import listener
from webhook.server.app import AppConfig, create_app
from webhook.server.tls import ReloadingTLS

DRAIN, TIMEOUT = 1.5, 8.0


def start_server(pki: Pki, policy_dir: Path, log: Path, *extra: str, level: str = "INFO", port: int = 0) -> subprocess.Popen[bytes]:
    """`gpu-admission serve` in a process of its own, its JSON log lines written to ``log``; on a port
    the kernel picks (``listening_port`` finds it) unless ``port`` is given."""
    return subprocess.Popen(
        [sys.executable, "-m", "webhook", "--log-level", level, "serve", "--no-cluster", "--host", "127.0.0.1", "--port", str(port),
         "--policies", str(policy_dir), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
         "--drain", str(DRAIN), "--shutdown-timeout", str(TIMEOUT), *extra],
        cwd=REPO, stderr=log.open("wb"),
    )


@contextlib.contextmanager
def serving(pki: Pki, policy_dir: Path, log: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``start_server`` and the port it listens on; killed on the way out if the test left it running."""
    proc = start_server(pki, policy_dir, log, *extra)
    try:
        yield proc, listening_port(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def wait_ready(base: str, ctx: ssl.SSLContext, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        for _ in range(300):
            assert proc.poll() is None, f"server exited with {proc.returncode}"
            try:
                async with session.get(base + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("server never ready")


async def keep_alive_client(base: str, ctx: ssl.SSLContext, body: bytes, uid: str, tally: Counter[str]) -> None:
    """Requests one after another on a pooled connection until the server refuses to connect."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as session:
        while True:
            try:
                async with session.post(base + "/validate", data=body, headers={"Content-Type": "application/json"}) as resp:
                    answer = await resp.json()
                    ok = resp.status == 200 and answer["response"]["uid"] == uid
                    tally["answered" if ok else "bad"] += 1
                    if resp.headers.get("Connection", "").lower() == "close":
                        tally["closed-by-server"] += 1
            except aiohttp.ClientConnectorError:
                tally["refused at connect"] += 1
                return
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                tally[f"lost: {type(exc).__name__}"] += 1
                return


async def slow_upload(port: int, ctx: ssl.SSLContext, body: bytes, started: asyncio.Event) -> int:
    """Headers and half the body before SIGTERM, the rest during the drain: still answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    head = f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body[: len(body) // 2])
    await writer.drain()
    started.set()
    await asyncio.sleep(DRAIN / 2)
    writer.write(body[len(body) // 2 :])
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


@pytest.mark.parametrize(("flags", "event_loop"), [((), "uvloop"), (("--event-loop", "asyncio"), "asyncio")],
                         ids=["default-uvloop", "asyncio"])
async def test_sigterm_under_keep_alive_load_loses_no_request(
    pki: Pki, policy_dir: Path, tmp_path: Path, flags: tuple[str, ...], event_loop: str
) -> None:
    with serving(pki, policy_dir, tmp_path / "server.log", *flags) as (proc, port):
        base, ctx = f"https://127.0.0.1:{port}", pki.client_context()
        await wait_ready(base, ctx, proc)
        sent = load_review(corpus_reviews()[0])
        body, uid = json.dumps(sent).encode(), sent["request"]["uid"]
        tally: Counter[str] = Counter()
        clients = [asyncio.create_task(keep_alive_client(base, ctx, body, uid, tally)) for _ in range(20)]
        uploading = asyncio.Event()
        upload = asyncio.create_task(slow_upload(port, ctx, body, uploading))
        await asyncio.sleep(1.0)
        await uploading.wait()
        before = tally["answered"]
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as probe:
            async with probe.get(base + "/readyz") as resp:
                ready_status = resp.status
        await asyncio.wait_for(asyncio.gather(*clients), TIMEOUT + 5)
        upload_status = await upload
        code = await asyncio.to_thread(proc.wait, TIMEOUT + 5)
        took = time.monotonic() - stopped_at
    print(dict(tally), f"exit {code} after {took:.2f} s")
    assert ready_status == 503, "not ready as soon as SIGTERM arrives"
    assert upload_status == 200, "a body still uploading at SIGTERM is answered"
    assert not [k for k in tally if k.startswith("lost") or k == "bad"], dict(tally)
    assert tally["answered"] > before, "requests arriving during the drain are answered"
    assert tally["closed-by-server"] > 0, "answers during the drain carry Connection: close"
    assert tally["refused at connect"] == 20
    assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()]
    assert lines[-1]["msg"] == "stopped", lines[-3:]
    assert not [line for line in lines if line["level"] == "error"]
    assert [line["msg"] for line in lines if line["msg"].startswith("serving on")] == [
        f"serving on https://127.0.0.1:{port} (event loop: {event_loop})"]


def test_a_port_in_use_is_one_line_and_exit_1(pki: Pki, policy_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = start_server(pki, policy_dir, tmp_path / "server.log", port=taken.getsockname()[1])
        assert proc.wait(30) == 1
    lines = (tmp_path / "server.log").read_text().splitlines()
    assert lines[-1].startswith("error: cannot listen on 127.0.0.1:") and "Traceback" not in "".join(lines)


async def test_a_port_in_use_stops_what_the_startup_began_before_the_error(pki: Pki, policy_dir: Path) -> None:
    """What the app's startup began (the cluster watches, the quota ledger's writers) is stopped by
    the listener that could not bind, in order and before the error, not by the loop's teardown."""
    events: list[str] = []

    async def began(app: web.Application) -> AsyncIterator[None]:
        events.append("started")
        yield
        events.append("stopped")

    tls = ReloadingTLS(pki.cert, pki.key)
    app = create_app(AppConfig(policies=policy_dir), tls=tls)
    app.cleanup_ctx.append(began)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            await listener.start(app, listener.ListenerConfig(host="127.0.0.1", port=taken.getsockname()[1]), tls.context)
        assert events == ["started", "stopped"]


def _handshake_then_review(sock: socket.socket, ctx: ssl.SSLContext, body: bytes) -> bytes:
    """The TLS handshake on an already accepted connection, then one review: the status line."""
    with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
        head = f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        tls.sendall(head.encode() + body)
        return tls.makefile("rb").readline()


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_a_connection_accepted_before_the_listener_closes_is_answered_after_its_handshake(
    pki: Pki, policy_dir: Path, tmp_path: Path, event_loop: str
) -> None:
    """Under load a client's TLS handshake can outlast the drain: the connection was accepted, its
    request is still to come, and the server must wait for it rather than stop."""
    with serving(pki, policy_dir, tmp_path / "server.log", "--event-loop", event_loop) as (proc, port):
        base, ctx = f"https://127.0.0.1:{port}", pki.client_context()
        await wait_ready(base, ctx, proc)
        body = json.dumps(load_review(corpus_reviews()[0])).encode()
        sock = socket.create_connection(("127.0.0.1", port))  # accepted; no ClientHello yet
        await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(DRAIN + 0.3)  # past the drain: the listener is closed
        status = await asyncio.wait_for(asyncio.to_thread(_handshake_then_review, sock, ctx, body), TIMEOUT)
        code = await asyncio.to_thread(proc.wait, TIMEOUT + 5)
    assert status.split()[1] == b"200", status
    assert code == 0


def _probe_and_failed_handshake(port: int) -> None:
    """A TCP probe (connect, close: a load balancer's health check) and a client whose first bytes
    are not a ClientHello: both accepted, neither ever completes a TLS handshake."""
    socket.create_connection(("127.0.0.1", port)).close()
    with socket.create_connection(("127.0.0.1", port)) as garbage:
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        garbage.settimeout(10)
        while garbage.recv(4096):  # the server gives up on the handshake and closes
            pass


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_a_probe_or_a_failed_handshake_before_sigterm_does_not_hold_the_stop(
    pki: Pki, policy_dir: Path, tmp_path: Path, event_loop: str
) -> None:
    """Neither asyncio's nor uvloop's TLS transport tells the connection's protocol that its handshake
    failed; the stop must not wait the handshake timeout for such a connection. The bound below is
    a behaviour bound (a third of the handshake timeout), not a speed target."""
    handshake = 30.0
    with serving(pki, policy_dir, tmp_path / "server.log", "--event-loop", event_loop,
                        "--handshake-timeout", str(handshake), "--shutdown-timeout", str(handshake + 10)) as (proc, port):
        base, ctx = f"https://127.0.0.1:{port}", pki.client_context()
        await wait_ready(base, ctx, proc)
        await asyncio.to_thread(_probe_and_failed_handshake, port)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, handshake + 15)
        took = time.monotonic() - stopped_at
    assert code == 0
    assert took < DRAIN + handshake / 3, f"the stop waited {took:.1f} s for connections that will never send a request"


async def test_serve_parks_a_trickling_head_after_park_after_seconds(pki: Pki, policy_dir: Path, tmp_path: Path) -> None:
    """`serve --park-after` reaches the listener: a head trickling past it is parked (counted in /metrics)."""
    with serving(pki, policy_dir, tmp_path / "server.log", "--park-after", "0.2", "--header-timeout", "1") as (proc, port):
        base, ctx = f"https://127.0.0.1:{port}", pki.client_context()
        await wait_ready(base, ctx, proc)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
        writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        for n in range(4):
            await asyncio.sleep(0.1)
            writer.write(f"X-{n}: y\r\n".encode())
        try:
            assert await asyncio.wait_for(reader.read(), 5) == b"", "dropped at the header timeout"
        except ConnectionResetError:  # (dropped: a reset is as good as a close)
            pass
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
    assert "gpu_admission_parked_connections_total 1.0" in text
    assert 'gpu_admission_rejected_requests_total{reason="header-timeout"} 1.0' in text


@pytest.mark.parametrize("flag, value", [
    ("--handshake-timeout", "0"), ("--header-timeout", "-1"), ("--park-after", "-0.5"), ("--drain", "nan"),
    ("--body-timeout", "soon"), ("--idle-timeout", "inf"),
])
def test_serve_refuses_a_duration_that_is_none_with_a_usage_error(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any work: a zero handshake timeout would make the listener raise, a negative
    --park-after silently mean "never"."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--no-cluster", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and repr(value) in err and "Traceback" not in err


def test_serve_takes_zero_where_zero_means_never() -> None:
    args = cli._parser().parse_args(["serve", "--park-after", "0", "--drain", "0"])
    assert (args.park_after, args.drain) == (0.0, 0.0)

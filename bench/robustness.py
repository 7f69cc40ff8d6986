"""Soak: the figures of a real `gpu-admission serve` process under hostile load.

Each figure is measured against a baseline taken in the same run (the
machine is shared and noisy): normal-request p99 unloaded, then under 500
slowloris connections and 50 slow bodies, then beside one 25,000-container
pod per second; the CPU a gzip bomb costs; /metrics after 5,000 distinct
kinds; memory per idle TLS connection.

    make soak            # or: python bench/robustness.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import ssl
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import fuzz  # noqa: E402
from tests.conftest import Pki, make_pki  # noqa: E402
from tests.support import POLICIES, corpus_reviews, load_review  # noqa: E402
from tests.test_server_shutdown import free_port, start_server, wait_ready  # noqa: E402

HEADER_TIMEOUT, BODY_TIMEOUT = 5.0, 10.0
REVIEW = load_review(corpus_reviews()[1])
NORMAL = fuzz.Case("/validate", json.dumps(REVIEW).encode(), {}, REVIEW["request"]["uid"], "normal")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def latencies(base: str, ctx: ssl.SSLContext, seconds: float, clients: int = 4) -> list[float]:
    """Normal reviews on keep-alive connections for ``seconds``; each answer's latency."""
    samples: list[float] = []
    stop = time.monotonic() + seconds

    async def client() -> None:
        connection = fuzz.Connection(base, ctx)
        while time.monotonic() < stop:
            started = time.perf_counter()
            status, _ = await connection.post(NORMAL)
            assert status == 200, status
            samples.append(time.perf_counter() - started)

    await asyncio.gather(*(client() for _ in range(clients)))
    return samples


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def report(name: str, value: str) -> None:
    print(f"  {name:<58} {value}", flush=True)


async def metrics_growth(base: str, ctx: ssl.SSLContext, kinds: int) -> None:
    connection = fuzz.Connection(base, ctx)
    size_before = len(await get(base, ctx, "/metrics"))
    for n in range(kinds):
        review = json.loads(NORMAL.body)
        review["request"]["kind"]["kind"] = f"Kind{n}\udc00"
        await connection.post(fuzz.Case("/validate", json.dumps(review).encode(), {}, REVIEW["request"]["uid"]))
    size_after = len(await get(base, ctx, "/metrics"))
    report(f"/metrics size before / after {kinds} distinct kinds (lone surrogates)", f"{size_before} B / {size_after} B")


async def get(base: str, ctx: ssl.SSLContext, path: str) -> bytes:
    host, port = base.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname="localhost")
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = await fuzz.read_answer(reader)
    writer.close()
    assert b" 200 " in answer.split(b"\r\n", 1)[0], answer[:200]
    return answer.partition(b"\r\n\r\n")[2]


def gzip_bomb(inflated: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1024 * 1024)
    return b"".join(packer.compress(chunk) for _ in range(inflated // len(chunk))) + packer.flush()


async def bomb(base: str, ctx: ssl.SSLContext, pid: int) -> None:
    body = gzip_bomb(1024**3)
    case = fuzz.Case("/validate", body, {"Content-Encoding": "gzip"})
    cpu, started = cpu_seconds(pid), time.perf_counter()
    status, _ = await fuzz.Connection(base, ctx).post(case)
    took, used = time.perf_counter() - started, cpu_seconds(pid) - cpu
    report(f"gzip bomb {len(body) // 1024} KiB -> 1 GiB: answer, time, server CPU", f"{status} in {took:.3f} s, {used:.3f} s CPU")


def big_pod(containers: int) -> fuzz.Case:
    review = json.loads(NORMAL.body)
    review["request"]["object"]["spec"]["containers"] = [
        {"name": f"c{n}", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for n in range(containers)
    ]
    return fuzz.Case("/validate", json.dumps(review).encode(), {}, REVIEW["request"]["uid"], "big")


async def big_pods(base: str, ctx: ssl.SSLContext, seconds: float, unloaded: float) -> None:
    case = big_pod(25_000)
    connection = fuzz.Connection(base, ctx)
    started = time.perf_counter()
    status, body = await connection.post(case)
    took = time.perf_counter() - started
    answer = json.loads(body)
    verdict = f"allowed={answer['response']['allowed']}" if status == 200 else answer["message"][:40]
    report(f"one {len(case.body) / 2**20:.1f} MiB pod of 25,000 containers: answer, time", f"{status} {verdict}… in {took:.3f} s")

    async def one_per_second() -> None:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            await connection.post(case)
            await asyncio.sleep(1.0)

    sender = asyncio.create_task(one_per_second())
    loaded = p99(await latencies(base, ctx, seconds))
    await sender
    report("normal p99 beside one such pod per second (x unloaded)", f"{loaded * 1000:.1f} ms ({loaded / unloaded:.2f}x)")


def slow_clients(base: str, cafile: str, slowloris: int, bodies: int, out: Any) -> None:
    """In a process of its own (its event loop must not delay the latency probes)."""
    asyncio.run(_slow_clients(base, cafile, slowloris, bodies, out))


async def _slow_clients(base: str, cafile: str, slowloris: int, bodies: int, out: Any) -> None:
    ctx = ssl.create_default_context(cafile=cafile)
    host, port = base.removeprefix("https://").split(":")

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, float]:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname="localhost")
        return reader, writer, time.monotonic()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, started: float, body: bool) -> float:
        """A header line (or a body byte) a second until the server closes; how long since connecting."""
        if body:
            writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        else:
            writer.write(b"POST /validate HTTP/1.1\r\n")
        n = 0
        while not reader.at_eof() and time.monotonic() - started < 60:
            try:
                writer.write(b"x" if body else f"X-{n}: y\r\n".encode())
                await writer.drain()
                await asyncio.wait_for(reader.read(), 1.0)
            except (asyncio.TimeoutError, ConnectionError, ssl.SSLError):
                pass
            n += 1
        return time.monotonic() - started

    streams = [await connect() for _ in range(slowloris + bodies)]
    out.put("open")
    closed = await asyncio.gather(
        *(trickle(r, w, t, n >= slowloris) for n, (r, w, t) in enumerate(streams)), return_exceptions=True
    )
    out.put([c if isinstance(c, float) else -1.0 for c in closed])


async def slow_load(base: str, pki: Pki, pid: int, slowloris: int, bodies: int) -> None:
    cpu = cpu_seconds(pid)
    unloaded = p99(await latencies(base, pki.client_context(), 3.0))
    idle_cpu = (cpu_seconds(pid) - cpu) / 3.0
    report("normal p99 unloaded, just before", f"{unloaded * 1000:.1f} ms")
    queue: multiprocessing.Queue[Any] = multiprocessing.Queue()
    worker = multiprocessing.Process(target=slow_clients, args=(base, str(pki.ca), slowloris, bodies, queue))
    worker.start()
    await asyncio.to_thread(queue.get)
    await asyncio.sleep(0.5)
    cpu = cpu_seconds(pid)
    loaded = p99(await latencies(base, pki.client_context(), HEADER_TIMEOUT - 1))
    slow_cpu = (cpu_seconds(pid) - cpu) / (HEADER_TIMEOUT - 1)
    closed = await asyncio.to_thread(queue.get)
    worker.join()
    after = p99(await latencies(base, pki.client_context(), 3.0))
    report("normal p99 unloaded, just after", f"{after * 1000:.1f} ms")
    baseline = (unloaded + after) / 2
    report(f"normal p99 under {slowloris} slowloris + {bodies} slow bodies (x unloaded mean)",
           f"{loaded * 1000:.1f} ms ({loaded / baseline:.2f}x)")
    report("server CPU while probing: unloaded / with the slow clients", f"{idle_cpu:.0%} / {slow_cpu:.0%} of a core")
    heads, slow_bodies = closed[:slowloris], closed[slowloris:]
    report(f"slowloris closed after (max; header timeout {HEADER_TIMEOUT:g} s)", f"{max(heads):.2f} s")
    report(f"slow bodies closed after (max; body timeout {BODY_TIMEOUT:g} s)", f"{max(slow_bodies):.2f} s")


async def idle_memory(base: str, ctx: ssl.SSLContext, pid: int, count: int) -> None:
    rss = rss_bytes(pid)
    connections = [fuzz.Connection(base, ctx) for _ in range(count)]
    for connection in connections:
        await connection.post(NORMAL)
    grown = rss_bytes(pid) - rss
    report(f"memory per idle keep-alive TLS connection ({count} open)", f"{grown / count / 1024:.0f} KiB")
    for connection in connections:
        if connection.streams:
            connection.streams[1].close()


async def run(quick: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki")
        port = free_port()
        proc = start_server(pki, POLICIES, port, Path(tmp) / "server.log", "--header-timeout", str(HEADER_TIMEOUT),
                            "--body-timeout", str(BODY_TIMEOUT), level="WARNING")
        base, ctx = f"https://127.0.0.1:{port}", pki.client_context()
        try:
            await wait_ready(base, ctx, proc)
            await latencies(base, ctx, 1.0)  # warm up
            unloaded = p99(await latencies(base, ctx, 3.0))
            report("normal p99 unloaded (4 keep-alive clients)", f"{unloaded * 1000:.1f} ms")
            await idle_memory(base, ctx, proc.pid, 200 if quick else 500)
            await metrics_growth(base, ctx, 500 if quick else 5000)
            await bomb(base, ctx, proc.pid)
            await big_pods(base, ctx, 5.0 if quick else 10.0, unloaded)
            await slow_load(base, pki, proc.pid, 100 if quick else 500, 10 if quick else 50)
        finally:
            proc.terminate()
            proc.wait(30)
        errors = [line for line in (Path(tmp) / "server.log").read_text().splitlines() if '"level": "error"' in line]
        report("server ERROR lines", str(len(errors)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer connections and kinds")
    args = parser.parse_args()
    print("gpu-admission robustness soak (real serve process, TLS on localhost)")
    asyncio.run(run(args.quick))


if __name__ == "__main__":
    main()

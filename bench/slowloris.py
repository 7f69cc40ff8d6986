"""Normal-request latency while slow clients hold connections, in interleaved rounds.

Each round measures the p99 of normal reviews unloaded, then during an
attack of ``slowloris`` connections trickling header lines and ``bodies``
connections trickling a body, one line (or byte) a second each, all in a
process of their own. The attack's life is cut into phases:

- *connect*: the slow connections being opened (a TLS handshake flood);
- *held*: all of them open, before the first header timeout: the figure the
  target speaks of;
- *closing*: the header timeouts closing the slowloris connections.

The machine is shared: one measurement of the same thing varies by up to
2x from one second to the next, so the figures are medians over rounds that
alternate unloaded and loaded windows.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import selectors
import socket
import ssl
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.proc import CLOCK_TICKS, cpu_seconds  # noqa: E402
from tests import fuzz  # noqa: E402
from tests.support import corpus_reviews, load_review  # noqa: E402

REVIEW = load_review(corpus_reviews()[1])
NORMAL = fuzz.Case("/validate", json.dumps(REVIEW).encode(), {}, REVIEW["request"]["uid"], "normal")
#: TLS handshakes the attacker runs at once while opening its connections
CONNECTING = 32
#: a phase's edges are cut this much inwards, so each phase holds only its own load
MARGIN = 0.2
#: with fixed-rate probes the *held* phase starts this long after the last connection opened:
#: reviews delayed by the handshake flood are sent late and catch up, and their wait belongs
#: to the *connect* phase (flat-out probes have no backlog to catch up)
SETTLE = 1.0
#: a round is *quiet* when other work on the (shared) machine took less than this many cores
#: while the connections were held
QUIET_CPU = 0.1
PHASES = ("unloaded", "connect", "held", "closing")


class Probe:
    """Normal reviews on ``clients`` keep-alive connections, opened once (a probe must not wait
    behind the attacker's handshakes to connect).

    ``rate`` 0: each client sends its next review as soon as it has the answer (the server
    runs flat out). Else each sends ``rate`` reviews a second on a fixed schedule, and a
    latency counts from the scheduled send, so a late send is counted as waiting."""

    def __init__(self, base: str, ctx: ssl.SSLContext, clients: int = 4, rate: float = 0.0) -> None:
        self.connections = [fuzz.Connection(base, ctx) for _ in range(clients)]
        self.rate = rate

    async def connect(self) -> None:
        await self.run(0.0)

    async def run(self, stop: asyncio.Event | float) -> list[tuple[float, float]]:
        """Until ``stop`` (an event, or seconds from now): each review's (monotonic time sent, latency)."""
        samples: list[tuple[float, float]] = []
        deadline = time.monotonic() + stop if isinstance(stop, float) else None

        def done() -> bool:
            return time.monotonic() >= deadline if deadline is not None else isinstance(stop, asyncio.Event) and stop.is_set()

        async def client(connection: fuzz.Connection, offset: float) -> None:
            scheduled = time.monotonic() + offset
            while True:
                if self.rate:
                    await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
                sent = min(scheduled, time.monotonic()) if self.rate else time.monotonic()
                status, _ = await connection.post(NORMAL)
                assert status == 200, status
                samples.append((sent, time.monotonic() - sent))
                scheduled += 1 / self.rate if self.rate else 0.0
                if done():
                    return

        count = len(self.connections)
        offsets = [n / count / self.rate if self.rate else 0.0 for n in range(count)]
        await asyncio.gather(*(client(c, o) for c, o in zip(self.connections, offsets)))
        return samples


def machine_busy_seconds() -> float:
    """User and system CPU time of all processes on the machine (every core), from /proc/stat
    (interrupt time left out: the loopback traffic of this run is counted there)."""
    user, nice, system = (int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4])
    return (user + nice + system) / CLOCK_TICKS


class OtherWork:
    """CPU used on the machine by processes other than ``pids``, from now on."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = sorted(set(pids))
        self.started, self.ours, self.machine = time.monotonic(), self._ours(), machine_busy_seconds()

    def _ours(self) -> float:
        return sum(map(cpu_seconds, self.pids))

    def since(self) -> float:
        """In cores, since this was made."""
        took = max(1e-3, time.monotonic() - self.started)
        return max(0.0, (machine_busy_seconds() - self.machine - (self._ours() - self.ours)) / took)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] if len(samples) > 1 else float("nan")


@dataclass(frozen=True)
class Placement:
    """Where the attacker process runs: ``cpus`` (None: anywhere) at niceness ``nice``; and the
    probed server (None: anywhere). A server attacked but not probed (the *elsewhere* arm)
    runs on the attacker's CPUs: it stands for another machine."""

    cpus: frozenset[int] | None = None
    nice: int = 0
    server_cpus: frozenset[int] | None = None

    def pin(self, target: Target) -> None:
        if self.server_cpus is not None and self.cpus is not None:
            os.sched_setaffinity(target.pid, self.server_cpus)
            if target.attacked_pid:
                os.sched_setaffinity(target.attacked_pid, self.cpus)

    def apply(self) -> None:
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        if self.nice:
            os.nice(self.nice)


def attacker(base: str, cafile: str, slowloris: int, bodies: int, out: Any, placement: Placement = Placement()) -> None:
    """In a process of its own (it must not delay the latency probes), on blocking TLS sockets
    and one selector: a trickled record costs the attacker a few microseconds of CPU (an asyncio
    stream's write, drain and one-second read timeout cost it ~80 µs: 46 ms a second for 550
    connections, in one burst on the machine the measured server shares). A real attacker runs
    on machines of its own; what it spends here is part of the floor, not of the server."""
    placement.apply()
    ctx = ssl.create_default_context(cafile=cafile)
    host, port = base.removeprefix("https://").split(":")

    def connect(_: int) -> tuple[ssl.SSLSocket, float]:
        started = time.monotonic()
        sock = ctx.wrap_socket(socket.create_connection((host, int(port))), server_hostname="localhost")
        sock.setblocking(False)
        return sock, started

    with ThreadPoolExecutor(CONNECTING) as pool:  # handshakes release the GIL
        streams = list(pool.map(connect, range(slowloris + bodies)))
    out.put((min(started for _, started in streams), time.monotonic()))
    out.put(_trickle(streams, slowloris))


#: the attack's first record on a connection: a request head begun, or a whole head and a body begun
HEAD, BODY = b"POST /validate HTTP/1.1\r\n", b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"


def _trickle(streams: list[tuple[ssl.SSLSocket, float]], slowloris: int) -> tuple[list[tuple[float, float]], list[tuple[int, float]]]:
    """A header line (or a body byte) a second on each connection, all in step, until the server
    closes it (or 60 s): (when each closed, how long after its connect) and each record written."""
    writes: list[tuple[int, float]] = []
    closed: list[tuple[float, float] | None] = [None] * len(streams)
    selector = selectors.DefaultSelector()
    for index, (sock, _) in enumerate(streams):
        selector.register(sock, selectors.EVENT_READ, index)
    lines = [0] * len(streams)
    tick = time.monotonic()
    while any(c is None for c in closed):
        now = time.monotonic()
        if now >= tick:
            for index, (sock, started) in enumerate(streams):
                if closed[index] is not None:
                    continue
                record = b"x" if index >= slowloris else f"X-{lines[index]}: y\r\n".encode()
                if lines[index] == 0:
                    record = (BODY if index >= slowloris else HEAD) + record
                lines[index] += 1
                try:
                    sock.send(record)
                    writes.append((index, time.monotonic()))
                except ssl.SSLWantWriteError:  # the server reads nothing and the buffers are full: wait
                    pass
                except (ConnectionError, ssl.SSLError):  # dropped by the server (a reset)
                    closed[index] = _close(selector, sock, started)
                if closed[index] is None and now - started >= 60:
                    closed[index] = _close(selector, sock, started)
            tick += 1.0
        for key, _ in selector.select(max(0.0, tick - time.monotonic())):
            sock, started = streams[key.data]
            if _at_end(sock):
                closed[key.data] = _close(selector, sock, started)
    return [c for c in closed if c is not None], writes


def _at_end(sock: ssl.SSLSocket) -> bool:
    """Read what the server sent (an answer, session tickets); True at its close."""
    try:
        while sock.recv(65536):
            pass
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True
    return True  # b"": the server closed


def _close(selector: selectors.BaseSelector, sock: ssl.SSLSocket, started: float) -> tuple[float, float]:
    selector.unregister(sock)
    sock.close()
    return time.monotonic(), time.monotonic() - started


def burst(writes: list[tuple[int, float]], lo: float, hi: float) -> tuple[float, float]:
    """The attack within [lo, hi): trickled records a second (connections over their median
    interval between records), and the width of its bursts: each connection writes once a
    second, so the shortest stretch of the one-second cycle that holds 90% of the records
    (their times modulo a second: a window cut at a fixed second would split a burst in two)."""
    inside = sorted(at for _, at in writes if lo <= at < hi)
    if len(inside) < 2:
        return 0.0, 0.0
    last: dict[int, float] = {}
    gaps = []
    for connection, at in sorted((c, at) for c, at in writes if lo <= at < hi):
        if connection in last:
            gaps.append(at - last[connection])
        last[connection] = at
    rate = len(last) / statistics.median(gaps) if gaps else 0.0
    phases = sorted((at - inside[0]) % 1.0 for at in inside)
    k = -(-9 * len(phases) // 10)
    around = phases + [p + 1.0 for p in phases]  # the cycle unrolled once: a burst may straddle its start
    return rate, min(around[i + k - 1] - around[i] for i in range(len(phases)))


@dataclass(frozen=True)
class Target:
    """Probed at ``base`` (process ``pid``) while the slow clients hold connections on
    ``attacked`` (default: the same server)."""

    name: str
    base: str
    pid: int
    attacked: str = ""
    attacked_pid: int = 0


@dataclass
class Round:
    p99s: dict[str, float]
    samples: dict[str, int]
    #: seconds from connect to the server's close: slowloris, slow bodies (max of each)
    closed_after: tuple[float, float]
    #: the server's CPU while the connections were held, in cores
    held_cpu: float
    #: the attack while held: trickled records a second, and the width of each second's burst
    records: tuple[float, float] = (0.0, 0.0)
    #: CPU used by processes other than this run's (servers, probes, attacker), in cores: the
    #: more of the unloaded and the held phases
    foreign_cpu: float = 0.0


@dataclass
class Rounds:
    rounds: list[Round] = field(default_factory=list)

    def quiet(self) -> Rounds:
        """The rounds during whose unloaded and held phases other work on the machine took under QUIET_CPU."""
        return Rounds([r for r in self.rounds if r.foreign_cpu < QUIET_CPU])

    def median(self, phase: str) -> float:
        return statistics.median(r.p99s[phase] for r in self.rounds) if self.rounds else float("nan")

    def ratio(self, phase: str) -> float:
        """The phase's median p99 over the median unloaded p99."""
        return self.median(phase) / self.median("unloaded")


async def one_round(target: Target, ctx: ssl.SSLContext, cafile: str, slowloris: int, bodies: int,
                    header_timeout: float, rate: float, placement: Placement = Placement()) -> Round:
    placement.pin(target)
    probe = Probe(target.base, ctx, rate=rate)
    await probe.connect()
    other = OtherWork([target.pid, target.attacked_pid or target.pid, os.getpid()])
    unloaded = [lat for _, lat in await probe.run(3.0)]
    foreign_unloaded = other.since()
    queue: multiprocessing.Queue[Any] = multiprocessing.Queue()
    worker = multiprocessing.Process(target=attacker, args=(target.attacked or target.base, cafile, slowloris, bodies, queue, placement))
    stop = asyncio.Event()
    started = time.monotonic()
    probing = asyncio.create_task(probe.run(stop))
    worker.start()
    first, opened = await asyncio.to_thread(queue.get)
    first_timeout = first + header_timeout
    other = OtherWork([target.pid, target.attacked_pid or target.pid, os.getpid(), worker.pid or os.getpid()])
    cpu, since = cpu_seconds(target.pid), time.monotonic()
    await asyncio.sleep(max(0.0, first_timeout - MARGIN - time.monotonic()))
    held_cpu = (cpu_seconds(target.pid) - cpu) / max(1e-3, time.monotonic() - since)
    foreign = max(foreign_unloaded, other.since())
    closed, writes = await asyncio.to_thread(queue.get)
    heads, slow_bodies = [took for _, took in closed[:slowloris]], [took for _, took in closed[slowloris:]]
    last_head = max(at for at, _ in closed[:slowloris])
    await asyncio.sleep(max(0.0, last_head + MARGIN - time.monotonic()))
    stop.set()
    samples = await probing
    worker.join()
    windows = {
        "connect": (started, opened), "held": (opened + (SETTLE if rate else MARGIN), first_timeout - MARGIN),
        "closing": (first_timeout - MARGIN, last_head + MARGIN),
    }
    phases = {"unloaded": unloaded} | {
        name: [lat for at, lat in samples if lo <= at < hi] for name, (lo, hi) in windows.items()
    }
    return Round(
        {name: p99(values) for name, values in phases.items()}, {name: len(v) for name, v in phases.items()},
        (max(heads), max(slow_bodies, default=0.0)), held_cpu, burst(writes, *windows["held"]), foreign,
    )


async def rounds(targets: list[Target], ctx: ssl.SSLContext, cafile: str, count: int, slowloris: int, bodies: int,
                 header_timeout: float, rate: float = 0.0, placement: Placement = Placement(), quiet: int = 0,
                 most: int = 0) -> dict[str, Rounds]:
    """``count`` rounds on each target, the targets taking turns; then more, up to ``most`` in all,
    until each target has ``quiet`` quiet rounds (the machine is shared: a round is kept or not
    by the other work measured during it, never by its latencies)."""
    result = {target.name: Rounds() for target in targets}
    done = 0
    while done < count or (done < most and any(len(r.quiet().rounds) < quiet for r in result.values())):
        for target in targets:
            measured = await one_round(target, ctx, cafile, slowloris, bodies, header_timeout, rate, placement)
            result[target.name].rounds.append(measured)
            print(f"    {target.name:<9} " + "  ".join(
                f"{phase} {measured.p99s[phase] * 1000:.1f} ms ({measured.samples[phase]})" for phase in PHASES
            ) + f"  server CPU held {measured.held_cpu:.0%}, other work {measured.foreign_cpu:.0%}, attack {measured.records[0]:.0f} records/s"
                f" in bursts of {measured.records[1] * 1000:.0f} ms", flush=True)
        done += 1
    return result

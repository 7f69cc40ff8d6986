"""The soak's slow-client attacker (bench/slowloris.py) against a real `serve`: the figures
`make soak` prints about slow clients are only as true as the attack it runs."""

from __future__ import annotations

import asyncio
import queue
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Pki
from tests.support import REPO
from tests.test_server_shutdown import serving, wait_ready

sys.path.insert(0, str(REPO / "bench"))

import slowloris  # noqa: E402

HEADS, BODIES = 4, 2
HEADER_TIMEOUT, BODY_TIMEOUT = 1.0, 4.0


async def test_the_attacker_trickles_on_every_connection_until_the_server_closes_it(
    pki: Pki, policy_dir: Path, tmp_path: Path
) -> None:
    out: queue.Queue[Any] = queue.Queue()
    with serving(pki, policy_dir, tmp_path / "server.log", "--header-timeout", str(HEADER_TIMEOUT),
                 "--body-timeout", str(BODY_TIMEOUT), "--park-after", "0.5") as (proc, port):
        base = f"https://127.0.0.1:{port}"
        await wait_ready(base, pki.client_context(), proc)
        await asyncio.to_thread(slowloris.attacker, base, str(pki.ca), HEADS, BODIES, out)
    first, opened = out.get_nowait()
    closed, writes = out.get_nowait()
    assert first <= opened
    assert len(closed) == HEADS + BODIES
    heads, bodies = [took for _, took in closed[:HEADS]], [took for _, took in closed[HEADS:]]
    # closed by the server's timeouts, not by the attacker's own 60 s: heads at the header
    # timeout, bodies (whose heads arrived whole) at the body timeout, later
    assert all(HEADER_TIMEOUT <= took < BODY_TIMEOUT for took in heads), heads
    assert all(BODY_TIMEOUT <= took < 10 * BODY_TIMEOUT for took in bodies), bodies
    # a record a second on each connection while it was open: two for each slow body at least
    per_connection = [sum(1 for index, _ in writes if index == n) for n in range(HEADS + BODIES)]
    assert all(count >= 1 for count in per_connection[:HEADS]), per_connection
    assert all(count >= 2 for count in per_connection[HEADS:]), per_connection
    _, width = slowloris.burst(writes, min(at for _, at in writes), max(at for _, at in writes) + 1e-3)
    assert 0 < width < 0.5, "the connections write in step, one burst a second"

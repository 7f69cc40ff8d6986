"""The harness itself: a port another process takes between being picked and being bound costs a retry, not the run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e import apiserver as harness
from tests.support import free_ports


def test_free_ports_are_distinct() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50


def test_a_port_taken_before_etcd_binds_it_is_retried_on_new_ports(
        apiserver: harness.ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the session's apiserver fixture: this runs only where the suite can start one)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        picks: list[list[int]] = []

        def first_pick_collides(count: int) -> list[int]:
            ports = free_ports(count)
            picks.append([port, *ports[1:]] if not picks else ports)  # etcd's client port, once
            return picks[-1]

        monkeypatch.setattr(harness, "free_ports", first_pick_collides)
        server = harness.ApiServer(apiserver.assets, tmp_path / "kube")
        try:
            server.start()
            assert server._readyz() and len(picks) == 2 and picks[1][0] != port
        finally:
            server.cleanup()

"""The harness itself: a port another process takes between being picked and being bound costs a retry, not the run."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e import apiserver as harness
from tests.e2e.admission import DEPLOY, WEBHOOK_FILES, Admission
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, documents
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


def test_a_webhook_port_taken_before_gpu_admission_binds_it_moves_the_webhooks_to_a_new_one(
        admission: Admission, admin: Kube, namespace: str) -> None:
    """The server's port is picked before the webhook configurations are registered and bound when
    it starts: another process taking it meanwhile costs a new port, not the run."""
    admission.stop()
    old = admission.port
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (the stopped server's TIME_WAITs)
        taken.bind(("127.0.0.1", old))
        taken.listen()
        admission.start()
    assert admission.port != old
    for name in WEBHOOK_FILES:
        for doc in documents(DEPLOY / name):
            config = admin.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
            assert {urlsplit(h["clientConfig"]["url"]).port for h in config["webhooks"]} == {admission.port}
            assert [h["clientConfig"]["caBundle"] for h in config["webhooks"]], "nothing else changed"
    stored = admin.create(pod("moved", namespace, gpu_container()))
    assert stored["spec"]["runtimeClassName"] == "nvidia", "admitted through the server on its new port"

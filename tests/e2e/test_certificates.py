"""Certificate rotation while kube-apiserver calls the webhook: not one call fails."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.e2e.admission import NAMESPACE, TLS_SECRET, Admission
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Refused, eventually

#: how long the kubelet takes at the least to project a changed Secret into the pod (its sync
#: period is a minute by default); the rotation relies on the apiserver having the new caBundle by then
KUBELET_DELAY = 2.0


@dataclass
class Load:
    """Pods created (dry run) through the apiserver, as fast as one client goes."""

    kube: Kube
    namespace: str
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        manifest = pod("load", self.namespace, gpu_container())
        while not self.stop.is_set():
            try:
                stored = self.kube.create(manifest, dry_run="All")
                assert stored["spec"]["runtimeClassName"] == "nvidia"  # really mutated by us
                self.ok += 1
            except (Refused, AssertionError) as exc:
                self.failures.append(str(exc))


@pytest.fixture
def load(admission: Admission, namespace: str) -> Iterator[Load]:
    running = Load(Kube(admission.admin_kubeconfig), namespace)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop.set()
        thread.join(30)
        running.kube.close()


def _served(admission: Admission) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", admission.port), timeout=5) as sock:
        with ctx.wrap_socket(sock) as tls:
            return tls.getpeercert(binary_form=True) or b""


def _in_secret(admin: Kube) -> bytes:
    data = admin.core.read_namespaced_secret(TLS_SECRET, NAMESPACE).data or {}
    return x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])).public_bytes(Encoding.DER)


def _rotate(admission: Admission, admin: Kube, load: Load, *args: str) -> None:
    before = load.ok
    admission.certs("rotate", *args)
    time.sleep(KUBELET_DELAY)
    admission.project_secret()
    new = _in_secret(admin)
    eventually(lambda: _served(admission) == new, what="the server serving the new certificate")
    eventually(lambda: load.ok > before + 20, what="calls through the apiserver after the rotation")


def test_rotations_under_load_fail_no_call(admission: Admission, admin: Kube, load: Load) -> None:
    eventually(lambda: load.ok > 20, what="load through the apiserver")
    _rotate(admission, admin, load)
    _rotate(admission, admin, load, "--rotate-ca")
    _rotate(admission, admin, load)
    assert load.failures == []
    # the bundle holds the new and the previous CA; installing again changes nothing
    assert "nothing to do" in admission.certs("install")

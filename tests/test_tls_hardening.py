"""A tenant cannot get around the policies at the transport (issue #42): TLS as the best peers ship it
(no TLS below 1.2, TLS 1.2 with forward-secret AEAD suites only, TLS 1.3 as is), checked with Debian's
real ``openssl s_client`` against a real ``serve``; client identities restricted to ``--client-name``;
/metrics off the TLS port and on a plain one of its own with ``--metrics-port``."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Pki, StartWebhook, make_pki
from tests.support import REPO, free_port, listening_ports, unavailable
from webhook import certs
from webhook.server import keys, listener
from webhook.server.tls import TLS12_CIPHERS, peer_names

#: TLS 1.2 suites a server must refuse, which OpenSSL's defaults allow: CBC with HMAC-SHA2 (the ECDSA
#: ones our ECDSA certificates could negotiate)
CBC_SUITES = ("ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA256")
AEAD_SUITES = ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305")
#: an old client: TLS 1.1, and every suite at security level 0 (Debian's openssl.cnf asks for 1.2 and level 2)
TLS11 = ("-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0")


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        unavailable("no openssl: `make tls-tools` installs Debian's openssl (apt-get, as root)")
    return found


@dataclass(frozen=True)
class Handshake:
    ok: bool
    protocol: str
    suite: str
    output: str


def s_client(port: int, ca: Path, *flags: str, cert: tuple[Path, Path] | None = None) -> Handshake:
    """``openssl s_client`` to 127.0.0.1:``port`` verifying the server against ``ca``; what it negotiated."""
    argv = [_openssl(), "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", "-CAfile", str(ca),
            "-verify_return_error", "-brief", *flags]
    if cert is not None:
        argv += ["-cert", str(cert[0]), "-key", str(cert[1])]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    out = done.stdout + done.stderr
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return Handshake(done.returncode == 0 and "CONNECTION ESTABLISHED" in out,
                     fields.get("Protocol version", ""), fields.get("Ciphersuite", ""), out)


@contextlib.contextmanager
def serving(pki: Pki, policies: Path, *flags: str, ports: int = 1) -> Iterator[set[int]]:
    """A real ``gpu-admission serve`` on 127.0.0.1 (the kernel picks its ports): the ports it listens on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook", "serve", "--no-cluster", "--host", "127.0.0.1", "--port", "0",
         "--policies", str(policies), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), *flags],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield listening_ports(proc, ports)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pki, int]]:
    """One real `serve` at its defaults for the module's handshakes."""
    from tests.support import POLICIES

    pki = make_pki(tmp_path_factory.mktemp("pki"))
    with serving(pki, POLICIES) as ports:
        yield pki, ports.pop()


def test_openssl_can_speak_what_the_server_refuses(tmp_path: Path) -> None:
    """The control: this openssl, so configured, negotiates TLS 1.1 and CBC suites with a server that
    accepts them (openssl s_server), so a refusal below is the server's doing, not the client's."""
    pki = make_pki(tmp_path)
    port = free_port()
    results = []
    for flags in (TLS11, *(("-tls1_2", "-cipher", suite) for suite in CBC_SUITES)):
        server = subprocess.Popen(
            [_openssl(), "s_server", "-accept", f"127.0.0.1:{port}", "-cert", str(pki.cert), "-key", str(pki.key),
             "-cipher", "ALL:@SECLEVEL=0", "-www", "-quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                done = s_client(port, pki.ca, *flags)
                if "Connection refused" not in done.output:
                    break
                time.sleep(0.05)
            results.append((done.ok, done.protocol))
        finally:
            server.terminate()
            server.wait()
    assert results == [(True, "TLSv1.1")] + [(True, "TLSv1.2")] * len(CBC_SUITES)


def test_serve_refuses_tls_below_1_2(served: tuple[Pki, int]) -> None:
    pki, port = served
    old = s_client(port, pki.ca, *TLS11)
    assert not old.ok and not old.suite, old.output


@pytest.mark.parametrize("suite", CBC_SUITES)
def test_serve_refuses_cbc_suites_in_tls_1_2(served: tuple[Pki, int], suite: str) -> None:
    pki, port = served
    done = s_client(port, pki.ca, "-tls1_2", "-cipher", suite)
    assert not done.ok, done.output


@pytest.mark.parametrize("suite", AEAD_SUITES)
def test_serve_accepts_aead_suites_in_tls_1_2(served: tuple[Pki, int], suite: str) -> None:
    pki, port = served
    done = s_client(port, pki.ca, "-tls1_2", "-cipher", suite)
    assert (done.ok, done.protocol, done.suite) == (True, "TLSv1.2", suite), done.output


def test_serve_speaks_tls_1_3_as_is(served: tuple[Pki, int]) -> None:
    pki, port = served
    done = s_client(port, pki.ca, "-tls1_3")
    assert done.ok and done.protocol == "TLSv1.3" and done.suite.startswith("TLS_"), done.output
    chacha = s_client(port, pki.ca, "-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
    assert chacha.ok and chacha.suite == "TLS_CHACHA20_POLY1305_SHA256", chacha.output


def test_the_suites_offered_are_forward_secret_aead_only() -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers(TLS12_CIPHERS)
    tls12 = [c for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 and all(c["aead"] and c["kea"] == "kx-ecdhe" for c in tls12), tls12


async def test_python_clients_get_aead_in_tls_1_2_and_cbc_refused(start_webhook: StartWebhook, pki: Pki) -> None:
    """The same through Python's ssl (the in-process server, as the other TLS tests run it)."""
    hook = await start_webhook()
    port = int(hook.base.rsplit(":", 1)[1])

    async def handshake(suite: str) -> str:
        ctx = pki.client_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(suite)
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
        cipher = writer.get_extra_info("cipher")
        writer.close()
        return str(cipher[0])

    for suite in CBC_SUITES:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake(suite)
    for suite in AEAD_SUITES:
        assert await handshake(suite) == suite


# --client-name


@dataclass(frozen=True)
class Clients:
    ca: Path
    #: name → (certificate, key), each signed by the client CA
    pairs: dict[str, tuple[Path, Path]]

    def context(self, pki: Pki, name: str) -> ssl.SSLContext:
        ctx = pki.client_context()
        ctx.load_cert_chain(*self.pairs[name])
        return ctx


@pytest.fixture
def clients(tmp_path: Path) -> Clients:
    folder = tmp_path / "clients"
    ca = certs.generate_ca("client CA")
    certs.write_pair(folder, ca, "ca.crt", "ca.key")
    pairs = {}
    for name in ("kube-apiserver", "gpu-admission.gpu-admission.svc", "intruder"):
        certs.write_pair(folder, certs.generate_serving(ca, [name], client=True), f"{name}.crt", f"{name}.key")
        pairs[name] = (folder / f"{name}.crt", folder / f"{name}.key")
    return Clients(folder / "ca.crt", pairs)


async def _get(url: str, ctx: ssl.SSLContext) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s:
        async with s.get(url) as resp:
            await resp.read()
            return resp.status


async def test_client_name_accepts_only_the_names_given(start_webhook: StartWebhook, pki: Pki, clients: Clients) -> None:
    """A certificate the client CA signed for another name is closed after its handshake, before any
    HTTP is read; the names given pass (by subject CN or DNS SAN alike), and the refusal is counted."""
    names = frozenset({"kube-apiserver", "gpu-admission.gpu-admission.svc"})
    hook = await start_webhook(client_ca=clients.ca,
                               listen=listener.ListenerConfig(host="127.0.0.1", port=0, client_names=names))
    url = hook.base + "/healthz"
    for name in sorted(names):
        assert await _get(url, clients.context(pki, name)) == 200
    with pytest.raises(aiohttp.ClientError):
        await _get(url, clients.context(pki, "intruder"))
    with pytest.raises(aiohttp.ClientError):
        await _get(url, pki.client_context())  # no certificate at all: the handshake fails (--client-ca)
    assert hook.app[keys.METRICS].rejected.labels("client-name")._value.get() >= 1  # (aiohttp retries a GET once)


def test_peer_names_are_the_common_name_and_the_alternative_names() -> None:
    cert = {"subject": ((("countryName", "DE"),), (("commonName", "kube-apiserver"),)),
            "subjectAltName": (("DNS", "api.example"), ("IP Address", "10.0.0.1"), ("URI", "spiffe://c/ns/x"),
                               ("email", "a@b"))}
    assert peer_names(cert) == {"kube-apiserver", "api.example", "10.0.0.1", "spiffe://c/ns/x"}
    assert peer_names({}) == frozenset()


def test_serve_with_client_name_refuses_other_names_with_real_openssl(tmp_path: Path, clients: Clients) -> None:
    """``serve --client-ca F --client-name N``: openssl with N's certificate is answered; with another
    name's (same CA) its connection is closed before an answer; a --client-name without --client-ca is refused."""
    from tests.support import POLICIES

    pki = make_pki(tmp_path / "pki")
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

    def get(port: int, name: str) -> str:
        argv = [_openssl(), "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", "-CAfile",
                str(pki.ca), "-quiet", "-cert", str(clients.pairs[name][0]), "-key", str(clients.pairs[name][1])]
        return subprocess.run(argv, input=request, capture_output=True, timeout=30).stdout.decode()

    with serving(pki, POLICIES, "--client-ca", str(clients.ca), "--client-name", "kube-apiserver") as ports:
        port = ports.pop()
        assert get(port, "kube-apiserver").startswith("HTTP/1.1 200 ")
        assert get(port, "intruder") == ""
    done = subprocess.run([sys.executable, "-m", "webhook", "serve", "--no-cluster", "--client-name", "x"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--client-name needs --client-ca" in done.stderr


# --metrics-port


async def test_metrics_move_to_a_plain_port_of_their_own(start_webhook: StartWebhook, pki: Pki, clients: Clients) -> None:
    """With a metrics port, /metrics is served there in plain HTTP (with /healthz and /readyz: the
    kubelet's probes carry no client certificate) and no longer on the TLS port; nothing else is
    served on the plain port."""
    hook = await start_webhook(client_ca=clients.ca, serve_metrics=False,
                               listen=listener.ListenerConfig(host="127.0.0.1", port=0, metrics_port=0))
    assert hook.listener is not None and hook.listener.metrics_port
    plain = f"http://127.0.0.1:{hook.listener.metrics_port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(plain + "/metrics") as resp:
            assert resp.status == 200 and "gpu_admission_policies_loaded" in await resp.text()
        for path in ("/healthz", "/readyz"):
            async with s.get(plain + path) as resp:
                assert resp.status == 200, path
        for path in ("/mutate", "/validate"):
            async with s.post(plain + path, json={}) as resp:
                assert resp.status == 404, path
    apiserver = clients.context(pki, "kube-apiserver")
    assert await _get(hook.base + "/metrics", apiserver) == 404
    assert await _get(hook.base + "/healthz", apiserver) == 200
    hook.app[keys.DRAINING].set()  # (the plain port's /readyz follows the server's: 503 while draining)
    async with aiohttp.ClientSession() as s, s.get(plain + "/readyz") as resp:
        assert resp.status == 503


def test_serve_metrics_port_flag(tmp_path: Path) -> None:
    """``serve --metrics-port``: the plain port answers /metrics, the TLS port no longer does."""
    from tests.support import POLICIES
    import urllib.error
    import urllib.request

    pki = make_pki(tmp_path / "pki")
    with serving(pki, POLICIES, "--metrics-port", "0", ports=2) as ports:
        statuses = {}
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                    statuses[port] = ("http", resp.status, b"gpu_admission_" in resp.read())
            except (urllib.error.URLError, ConnectionError):
                ctx = pki.client_context()
                try:
                    urllib.request.urlopen(f"https://localhost:{port}/metrics", context=ctx, timeout=10)
                    statuses[port] = ("https", 200, True)
                except urllib.error.HTTPError as exc:
                    statuses[port] = ("https", exc.code, False)
    assert sorted(statuses.values()) == [("http", 200, True), ("https", 404, False)]

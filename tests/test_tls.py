"""TLS: hot reload without failed requests, TLS 1.2 minimum, client certificates."""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import Pki, StartWebhook, make_pki
from tests.support import corpus_reviews, file_reads, load_review
from webhook import certs
from webhook.errors import CertificateError
from webhook.server import keys, tls


async def served_certificate(port: int, ctx: ssl.SSLContext) -> x509.Certificate:
    """The certificate a new connection to the server is given."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


async def test_rotated_certificate_is_served_without_restart_or_failed_requests(
    start_webhook: StartWebhook, pki: Pki, tmp_path: Path
) -> None:
    hook = await start_webhook(reload_interval=0.05)
    port = int(hook.base.rsplit(":", 1)[1])
    new = make_pki(tmp_path / "rotated")
    trust_both = pki.client_context(new.ca)
    before = await served_certificate(port, trust_both)
    assert before.serial_number == x509.load_pem_x509_certificate(pki.cert.read_bytes()).serial_number

    sent = load_review(corpus_reviews()[0])
    failures: list[Any] = []
    stop = asyncio.Event()

    async def traffic() -> int:
        count = 0
        # a fresh connection per request, so handshakes happen across the swap
        while not stop.is_set():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust_both, force_close=True)) as s:
                async with s.post(hook.base + "/mutate", json=sent) as resp:
                    if resp.status != 200:
                        failures.append(resp.status)
            count += 1
        return count

    runner = asyncio.create_task(traffic())
    await asyncio.sleep(0.1)
    # as a Secret volume does: replace both files
    shutil.copy(new.key, pki.key)
    shutil.copy(new.cert, pki.cert)
    expected = x509.load_pem_x509_certificate(new.cert.read_bytes()).serial_number
    for _ in range(200):
        if (await served_certificate(port, trust_both)).serial_number == expected:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the rotated certificate was never served")
    await asyncio.sleep(0.1)
    stop.set()
    sent_count = await runner
    assert sent_count > 1 and not failures
    async with hook.session.get(hook.base + "/metrics", ssl=trust_both) as resp:
        assert 'gpu_admission_certificate_reloads_total{result="success"} 1.0' in await resp.text()


async def test_a_broken_new_pair_keeps_the_old_one(
    start_webhook: StartWebhook, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook = await start_webhook(reload_interval=0.05)
    port = int(hook.base.rsplit(":", 1)[1])
    other = make_pki(tmp_path / "other")
    with caplog.at_level(logging.INFO, logger="webhook"):
        shutil.copy(other.key, pki.key)  # key without its certificate: a mismatched pair
        await asyncio.sleep(0.3)
    cert = await served_certificate(port, pki.client_context())
    assert cert.serial_number == x509.load_pem_x509_certificate(pki.cert.read_bytes()).serial_number
    async with hook.session.get(hook.base + "/metrics") as resp:
        assert 'gpu_admission_certificate_reloads_total{result="error"}' in await resp.text()
    refused = f"new certificate not loaded, keeping the one in force: {pki.key} is not the key of {pki.cert} (a rotation half done?)"
    assert {r.getMessage() for r in caplog.records} == {refused}


async def test_unreadable_files_keep_the_pair_in_force(
    start_webhook: StartWebhook, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """A file gone (a volume being remounted): a warning at each check, not a refused pair, and the pair in force stays."""
    hook = await start_webhook(reload_interval=0.02)
    port, before = int(hook.base.rsplit(":", 1)[1]), hook.tls.current
    with caplog.at_level(logging.INFO, logger="webhook"):
        await asyncio.to_thread(pki.key.unlink)
        for _ in range(500):
            if caplog.records:
                break
            await asyncio.sleep(0.02)
    assert caplog.records and {r.getMessage() for r in caplog.records} == {
        f"certificate files not readable, keeping the loaded pair: [Errno 2] No such file or directory: '{pki.key}'"
    }
    assert hook.tls.current is before
    cert = await served_certificate(port, pki.client_context())
    assert cert.serial_number == x509.load_pem_x509_certificate(pki.cert.read_bytes()).serial_number
    assert [hook.app[keys.METRICS].tls_reloads.labels(r)._value.get() for r in ("success", "error")] == [0, 0]


async def test_tls_below_1_2_is_refused(start_webhook: StartWebhook, pki: Pki) -> None:
    hook = await start_webhook()
    port = int(hook.base.rsplit(":", 1)[1])
    old = pki.client_context()
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with pytest.warns(DeprecationWarning):
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        old.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        await served_certificate(port, old)
    modern = pki.client_context()
    modern.maximum_version = ssl.TLSVersion.TLSv1_2
    assert (await served_certificate(port, modern)).serial_number


async def test_client_certificates_are_required_with_client_ca(start_webhook: StartWebhook, pki: Pki, tmp_path: Path) -> None:
    clients = tmp_path / "clients"
    ca = certs.generate_ca("client CA")
    client = certs.generate_serving(ca, ["kube-apiserver"], client=True)
    certs.write_pair(clients, ca, "ca.crt", "ca.key")
    certs.write_pair(clients, client, "client.crt", "client.key")
    hook = await start_webhook(client_ca=clients / "ca.crt")
    url = f"{hook.base}/healthz"
    anonymous = pki.client_context()
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=anonymous)) as s:
            async with s.get(url) as resp:
                await resp.read()
    with_cert = pki.client_context()
    with_cert.load_cert_chain(clients / "client.crt", clients / "client.key")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=with_cert)) as s:
        async with s.get(url) as resp:
            assert resp.status == 200


async def test_many_rotations_at_a_short_interval_fail_no_handshake(start_webhook: StartWebhook, pki: Pki, tmp_path: Path) -> None:
    """Rotations in place (key and certificate rewritten one after the other, so a check can see
    a half-done one) and as a Secret volume does (a ``..data`` symlink swap), while clients open
    new connections non-stop: every handshake succeeds with a matching pair."""
    pairs = [make_pki(tmp_path / f"pki{i}") for i in range(3)]
    trust_all = pki.client_context(*(p.ca for p in pairs))
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "..data").symlink_to(pki.directory)
    for name in ("tls.crt", "tls.key"):
        (volume / name).symlink_to(Path("..data") / name)
    in_place = tmp_path / "in-place"
    shutil.copytree(pki.directory, in_place)
    hooks = [
        await start_webhook(reload_interval=0.02),
    ]
    hooks[0].tls.cert, hooks[0].tls.key = volume / "tls.crt", volume / "tls.key"
    second = await start_webhook(reload_interval=0.02)
    second.tls.cert, second.tls.key = in_place / "tls.crt", in_place / "tls.key"
    hooks.append(second)
    ports = [int(h.base.rsplit(":", 1)[1]) for h in hooks]
    failures: list[str] = []
    handshakes = 0
    stop = asyncio.Event()

    async def connect(port: int) -> None:
        nonlocal handshakes
        while not stop.is_set():
            try:
                await served_certificate(port, trust_all)
                handshakes += 1
            except (ssl.SSLError, OSError) as exc:
                failures.append(repr(exc))

    clients = [asyncio.create_task(connect(port)) for port in ports for _ in range(3)]
    rotations = 500

    def rotate() -> None:
        """From another thread, as the kubelet does: a write can land in the middle of a check."""
        for n in range(rotations):
            new = pairs[n % len(pairs)]
            if n % 2:
                link = volume / "..data_tmp"
                link.symlink_to(new.directory)
                link.replace(volume / "..data")
            else:
                (in_place / "tls.key").write_bytes(new.key.read_bytes())
                time.sleep(0.0005)  # a check may see the key without its certificate
                (in_place / "tls.crt").write_bytes(new.cert.read_bytes())
            time.sleep(0.01)

    await asyncio.to_thread(rotate)
    stop.set()
    await asyncio.gather(*clients)
    print(f"{rotations} rotations, {handshakes} handshakes, {len(failures)} failed")
    assert handshakes >= 100 and not failures, failures[:3]
    reloads = [h.app[keys.METRICS].tls_reloads.labels("success")._value.get() for h in hooks]
    assert all(r > 50 for r in reloads), reloads


async def test_a_client_without_server_name_gets_the_rotated_certificate_too(start_webhook: StartWebhook, pki: Pki, tmp_path: Path) -> None:
    hook = await start_webhook(reload_interval=0.02)
    port = int(hook.base.rsplit(":", 1)[1])
    new = make_pki(tmp_path / "rotated")
    shutil.copy(new.key, pki.key)
    shutil.copy(new.cert, pki.cert)
    expected = x509.load_pem_x509_certificate(new.cert.read_bytes()).serial_number
    no_sni = pki.client_context(new.ca)
    no_sni.check_hostname = False
    for _ in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=no_sni, server_hostname=None)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        if x509.load_der_x509_certificate(der).serial_number == expected:
            return
        await asyncio.sleep(0.02)
    pytest.fail("a client that sends no server name still gets the old certificate")


def expiry(cert: Path) -> float:
    return x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc.timestamp()


async def test_a_reload_reads_the_certificate_files_off_the_event_loop(
    start_webhook: StartWebhook, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reload's reads of certificate, key and client CA are no handshake's or request's wait:
    a Secret volume's ``..data`` swap (one atomic change) of all three, served whole."""
    # other expiries than the pair in force: the metrics must move
    new = Pki(tmp_path / "new", *certs.generate_files(tmp_path / "new", ["localhost"], ["127.0.0.1"], days=300))
    for pair, days in ((pki, 3650), (new, 3000)):
        ca = certs.generate_ca(f"client CA {days}", days=days)
        certs.write_pair(pair.directory, ca, "client-ca.crt", "client-ca.key")
        certs.write_pair(pair.directory, certs.generate_serving(ca, ["kube-apiserver"], client=True), "client.crt", "client.key")
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "..data").symlink_to(pki.directory)
    for name in ("tls.crt", "tls.key", "client-ca.crt"):
        (volume / name).symlink_to(Path("..data") / name)
    hook = await start_webhook(reload_interval=0.02, client_ca=volume / "client-ca.crt")
    hook.tls.cert, hook.tls.key = volume / "tls.crt", volume / "tls.key"  # (the same files: no change)
    port, loop_thread, before = int(hook.base.rsplit(":", 1)[1]), threading.get_ident(), hook.tls.current
    metrics = hook.app[keys.METRICS]

    def swap() -> None:
        link = volume / "..data_tmp"
        link.symlink_to(new.directory)
        link.replace(volume / "..data")

    with caplog.at_level(logging.INFO, logger="webhook"), file_reads(volume) as reads:
        await asyncio.to_thread(swap)  # (not on the loop either: only the server's reads count)
        for _ in range(500):
            if hook.tls.current is not before:
                break
            await asyncio.sleep(0.02)
        assert hook.tls.current is not before, "the new pair was never put in force"
    assert {str(volume / n) for n in ("tls.crt", "tls.key", "client-ca.crt")} <= {p for p, _ in reads}, "the reads were not seen"
    assert sorted({path for path, thread in reads if thread == loop_thread}) == [], "read on the event loop"

    client = new.client_context()
    client.load_cert_chain(new.directory / "client.crt", new.directory / "client.key")
    served = await served_certificate(port, client)  # the new CA's client certificate, the new serving pair
    assert served.serial_number == x509.load_pem_x509_certificate(new.cert.read_bytes()).serial_number
    assert [r.getMessage() for r in caplog.records if "certificate" in r.getMessage()] == [
        f"serving certificate reloaded from {volume / 'tls.crt'}"
    ]
    assert [metrics.tls_reloads.labels(r)._value.get() for r in ("success", "error")] == [1, 0]
    assert metrics.cert_not_after.labels("serving")._value.get() == expiry(new.cert)
    assert metrics.cert_not_after.labels("client-ca")._value.get() == expiry(new.directory / "client-ca.crt")
    assert expiry(new.cert) != expiry(pki.cert) and expiry(new.directory / "client-ca.crt") != expiry(pki.directory / "client-ca.crt")


def _self_signed(path: Path, not_after: datetime.datetime, *, encrypted: bool = False) -> tuple[Path, Path]:
    """A certificate valid until ``not_after`` and its key (under a password if ``encrypted``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(datetime.datetime(1990, 1, 1))
            .not_valid_after(not_after).sign(key, hashes.SHA256()))
    path.mkdir(parents=True, exist_ok=True)
    (path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = serialization.BestAvailableEncryption(b"secret") if encrypted else serialization.NoEncryption()
    (path / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path / "tls.crt", path / "tls.key"


@pytest.mark.parametrize("until", [
    datetime.datetime(2049, 12, 31, 23, 59, 59),  # the last UTCTime (YYMMDDHHMMSSZ)
    datetime.datetime(2050, 1, 1, 0, 0, 1),  # GeneralizedTime from 2050 on (RFC 5280 4.1.2.5)
    datetime.datetime(2031, 7, 4, 12, 30, 5),
    datetime.datetime(1999, 12, 31, 23, 0, 0),  # a UTCTime of the last century (YY 50-99)
])
def test_the_expiry_is_read_from_the_certificate_without_the_cryptography_package(tmp_path: Path, until: datetime.datetime) -> None:
    cert, key = _self_signed(tmp_path, until)
    expected = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc.timestamp()
    assert tls.not_after(b"intermediate text\n" + cert.read_bytes() + cert.read_bytes()) == expected  # (the chain's first)
    assert tls.ReloadingTLS(cert, key).not_after == expected == until.replace(tzinfo=datetime.UTC).timestamp()


def test_an_encrypted_key_or_a_file_without_a_certificate_is_refused_and_not_asked_for(tmp_path: Path, pki: Pki) -> None:
    cert, key = _self_signed(tmp_path / "encrypted", datetime.datetime(2040, 1, 1), encrypted=True)
    with pytest.raises(CertificateError, match="the key is encrypted"):  # (never OpenSSL's prompt on the terminal)
        tls.ReloadingTLS(cert, key)
    for text in (b"", b"-----BEGIN CERTIFICATE-----\nbm90IGRlcg==\n-----END CERTIFICATE-----\n", pki.key.read_bytes()):
        (tmp_path / "bad.crt").write_bytes(text)
        with pytest.raises(CertificateError, match="cannot load"):
            tls.ReloadingTLS(tmp_path / "bad.crt", pki.key)
    with pytest.raises(CertificateError, match="is not the key of"):
        tls.ReloadingTLS(cert, pki.key)

"""The server's TLS context, and the certificate pair it serves, reloaded when the files change.

A Kubernetes Secret volume swaps its files on rotation. Each check reads
the certificate and the key once, checks that they are a pair, and builds
a new SSLContext from those bytes; the listening context's SNI callback
then hands every new handshake the context in force. The swap is one
reference assignment: no handshake ever sees the new certificate with the
old key. Connections already open keep their session. A pair that does not
load (say the key is written before the certificate) is left for the next
check and the old pair stays in force.

A check is two steps so that the server touches no file on its event loop:
``read_change`` (stat, read, check, build the context: blocking, in a worker
thread) and ``use`` (the swap and its log line: no I/O, on the loop).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from webhook.errors import CertificateError

log = logging.getLogger(__name__)

#: TLS 1.2's suites: forward secret (ECDHE) and authenticated encryption (AES-GCM, ChaCha20-Poly1305)
#: only, in Mozilla's "intermediate" order, for ECDSA and RSA serving keys alike; no CBC, no static RSA
#: key exchange, no finite-field DHE. TLS 1.3's suites (all AEAD) are OpenSSL's defaults, untouched.
TLS12_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
))


def _stamp(paths: list[Path]) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def peer_names(cert: Mapping[str, Any]) -> frozenset[str]:
    """The names a verified peer certificate (``SSLObject.getpeercert()``) carries: its subject's
    common names and its DNS, IP and URI subject alternative names."""
    names: set[str] = set()
    for rdn in cert.get("subject", ()) or ():
        for key, value in rdn:
            if key == "commonName":
                names.add(str(value))
    for kind, value in cert.get("subjectAltName", ()) or ():
        if kind in ("DNS", "IP Address", "URI"):
            names.add(str(value))
    return frozenset(names)


@dataclass(frozen=True)
class Pair:
    """A certificate chain and its key, read once and checked against each other."""

    chain: bytes
    key: bytes
    client_ca: bytes | None
    not_after: float
    client_ca_not_after: float


@dataclass(frozen=True)
class Rotation:
    """Changed files, read and checked: the context that serves their pair, or why they were not readable."""

    stamp: tuple[tuple[int, int, int], ...]
    #: the new pair and the context built whole from it; None: the files could not be stat'ed
    pair: Pair | None
    context: ssl.SSLContext | None
    unreadable: str = ""


@dataclass
class ReloadingTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None
    #: the listening context (give it to the server); it serves ``current``'s pair
    context: ssl.SSLContext = field(init=False)
    #: the context of the pair in force, swapped whole on reload
    current: ssl.SSLContext = field(init=False)
    not_after: float = field(init=False, default=0.0)
    client_ca_not_after: float = field(init=False, default=0.0)
    _stamp: tuple[tuple[int, int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        try:
            self._stamp = _stamp(self._paths())
        except OSError as exc:
            raise CertificateError(f"cannot read certificate files: {exc}") from exc
        pair = self._read()
        self.current = self._build(pair)
        # OpenSSL runs the callback for every ClientHello, with or without a server
        # name (tested); the pair is loaded here too so the context is complete alone
        self.context = self._build(pair)
        self.context.sni_callback = self._select
        self.not_after, self.client_ca_not_after = pair.not_after, pair.client_ca_not_after

    def _paths(self) -> list[Path]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])

    def _select(self, ssl_obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext) -> None:
        ssl_obj.context = self.current

    def _read(self) -> Pair:
        """Read each file once and check that key and certificate belong together."""
        try:
            chain, key = self.cert.read_bytes(), self.key.read_bytes()
            client_ca = self.client_ca.read_bytes() if self.client_ca else None
            cert = x509.load_pem_x509_certificate(chain)
            private = serialization.load_pem_private_key(key, password=None)
            ca_not_after = x509.load_pem_x509_certificate(client_ca).not_valid_after_utc.timestamp() if client_ca else 0.0
        except (OSError, ValueError, TypeError) as exc:
            raise CertificateError(f"cannot load {self.cert} / {self.key}: {exc}") from exc
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != private.public_key().public_bytes(
            serialization.Encoding.DER, spki
        ):
            raise CertificateError(f"{self.key} is not the key of {self.cert} (a rotation half done?)")
        return Pair(chain, key, client_ca, cert.not_valid_after_utc.timestamp(), ca_not_after)

    def _build(self, pair: Pair) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(TLS12_CIPHERS)
        # no renegotiation (TLS 1.2): a client cannot make the server redo its expensive half at will
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        self._load(ctx, pair)
        return ctx

    def _load(self, ctx: ssl.SSLContext, pair: Pair) -> None:
        try:
            with _pem_file(pair.key + b"\n" + pair.chain) as path:
                ctx.load_cert_chain(path)
            if pair.client_ca is not None:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=pair.client_ca.decode())
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load {self.cert} / {self.key}: {exc}") from exc

    def read_change(self) -> Rotation | None:
        """The files' new pair with its context, once they changed; None: unchanged.
        Raises CertificateError for a pair that does not load (the pair in force stays).
        Blocking (the disk, OpenSSL): the server calls it in a worker thread, one at a time."""
        try:
            stamp = _stamp(self._paths())
        except OSError as exc:
            return Rotation((), None, None, str(exc))
        if stamp == self._stamp:
            return None
        pair = self._read()
        # the stamp is taken before the read: a change during it shows at the next check
        return Rotation(stamp, pair, self._build(pair))

    def use(self, rotation: Rotation) -> bool:
        """Put ``rotation``'s pair in force (one reference assignment: a handshake gets the old
        context or the new one, whole); False: the files were not readable. No I/O."""
        if rotation.pair is None or rotation.context is None:
            log.warning("certificate files not readable, keeping the loaded pair: %s", rotation.unreadable)
            return False
        self.current = rotation.context
        self.not_after, self.client_ca_not_after = rotation.pair.not_after, rotation.pair.client_ca_not_after
        self._stamp = rotation.stamp
        log.info("serving certificate reloaded from %s", self.cert)
        return True


@contextlib.contextmanager
def _pem_file(data: bytes) -> Iterator[str]:
    """A path to ``data`` for OpenSSL's file-only loader: in memory where the OS allows it."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("gpu-admission-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pair.pem"
        path.touch(mode=0o600)
        path.write_bytes(data)
        yield str(path)

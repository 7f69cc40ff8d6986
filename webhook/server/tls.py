"""The server's TLS context, and the certificate pair it serves, reloaded when the files change.

A Kubernetes Secret volume swaps its files on rotation. Each check reads
the certificate and the key once, checks that they are a pair, and builds
a new SSLContext from those bytes; the listening context's SNI callback
then hands every new handshake the context in force. The swap is one
reference assignment: no handshake ever sees the new certificate with the
old key. Connections already open keep their session. A pair that does not
load (say the key is written before the certificate) is left for the next
check and the old pair stays in force.

The files are read with the standard library alone: OpenSSL (``load_cert_chain``)
checks that the key is the certificate's, and the certificates' expiry is read
from their DER (``not_after``). The cryptography package would cost serve
~9 MB resident for these two things only (tests/test_serve_imports.py).

A check is two steps so that the server touches no file on its event loop:
``read_change`` (stat, read, check, build the context: blocking, in a worker
thread) and ``use`` (the swap and its log line: no I/O, on the loop).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import contextlib
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)


def not_after(pem: bytes) -> float:
    """The notAfter of the first certificate in ``pem``, as unix time; ValueError if there is none
    or it is not a certificate's DER (RFC 5280 4.1: Certificate ::= SEQUENCE { tbsCertificate
    SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity SEQUENCE { notBefore,
    notAfter }, ... }, ... }; a time is a UTCTime, YYMMDDHHMMSSZ, or a GeneralizedTime,
    YYYYMMDDHHMMSSZ)."""
    found = _PEM_CERT.search(pem)
    if found is None:
        raise ValueError("no PEM certificate found")
    try:
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True)
        _, start, _ = _der(der, 0, 0x30)  # Certificate
        _, at, _ = _der(der, start, 0x30)  # tbsCertificate
        if der[at] == 0xA0:  # [0] version
            at = _der(der, at, 0xA0)[2]
        at = _der(der, at, 0x02)[2]  # serialNumber
        at = _der(der, at, 0x30)[2]  # signature
        at = _der(der, at, 0x30)[2]  # issuer
        _, at, _ = _der(der, at, 0x30)  # validity
        at = _der(der, at, der[at])[2]  # notBefore
        tag, start, end = _der(der, at, der[at])  # notAfter
        text = der[start:end].decode("ascii")
    except (IndexError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a certificate: {exc}") from exc
    if tag == 0x17 and len(text) == 13 and text[-1] == "Z":  # UTCTime: 1950-2049 (RFC 5280 4.1.2.5.1)
        year = int(text[:2])
        text = ("19" if year >= 50 else "20") + text
    elif not (tag == 0x18 and len(text) == 15 and text[-1] == "Z"):
        raise ValueError("not a certificate: its notAfter is not a UTC time")
    if not text[:-1].isdigit():
        raise ValueError("not a certificate: its notAfter is not a UTC time")
    fields = (int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[8:10]), int(text[10:12]), int(text[12:14]))
    return float(calendar.timegm((*fields, 0, 0, 0)))


def _der(der: bytes, at: int, tag: int) -> tuple[int, int, int]:
    """The DER element at ``at``, which must be tagged ``tag``: its tag, where its content starts
    and where it ends (IndexError past the end, ValueError for another tag)."""
    if der[at] != tag:
        raise ValueError(f"not a certificate: tag {der[at]:#x} where {tag:#x} belongs")
    length, at = der[at + 1], at + 2
    if length & 0x80:
        count = length & 0x7F
        length, at = int.from_bytes(der[at:at + count], "big"), at + count
    if at + length > len(der):
        raise IndexError("element past the end")
    return tag, at, at + length


@dataclass(frozen=True)
class Pair:
    """A certificate chain and its key, read once (checked against each other when a context is built
    of them)."""

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
        """Read each file once (``_build`` checks that key and certificate belong together)."""
        try:
            chain, key = self.cert.read_bytes(), self.key.read_bytes()
            client_ca = self.client_ca.read_bytes() if self.client_ca else None
            ca_not_after = not_after(client_ca) if client_ca else 0.0
            return Pair(chain, key, client_ca, not_after(chain), ca_not_after)
        except (OSError, ValueError) as exc:
            raise CertificateError(f"cannot load {self.cert} / {self.key}: {exc}") from exc

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
                # (an encrypted key: OpenSSL would ask for its password on the terminal)
                ctx.load_cert_chain(path, password=_no_password)
            if pair.client_ca is not None:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=pair.client_ca.decode())
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise CertificateError(f"{self.key} is not the key of {self.cert} (a rotation half done?)") from exc
            raise CertificateError(f"cannot load {self.cert} / {self.key}: {exc}") from exc
        except (OSError, ValueError) as exc:
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


def _no_password() -> bytes:
    raise ValueError("the key is encrypted: gpu-admission reads unencrypted keys")


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

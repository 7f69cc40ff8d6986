"""A CA and serving certificates for the webhook, made with ``cryptography``.

kube-apiserver is written in Go, which checks only the subjectAltName (never
the CN), so every name the Service answers to goes in the SANs.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.errors import CertificateError

CA_CERT, CA_KEY = "ca.crt", "ca.key"
TLS_CERT, TLS_KEY = "tls.crt", "tls.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def service_names(service: str, namespace: str) -> list[str]:
    """Every DNS name a Service answers to inside the cluster."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def generate_ca(common_name: str = "gpu-admission CA", days: int = 3650, now: dt.datetime | None = None) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def generate_serving(
    ca: KeyPair,
    dns_names: Sequence[str],
    ips: Sequence[str] = (),
    days: int = 365,
    now: dt.datetime | None = None,
    client: bool = False,
) -> KeyPair:
    """A serving (or, with ``client``, a client) certificate signed by ``ca``."""
    if not dns_names and not ips:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        addresses = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    except ValueError as exc:
        raise CertificateError(f"not an IP address: {exc}") from exc
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans.extend(addresses)
    start = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(dns_names) or list(ips))[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(start + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def write_pair(directory: Path, pair: KeyPair, cert_name: str, key_name: str) -> None:
    """Write a certificate (0644) and its key (0600, never world-readable even briefly)."""
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / key_name, pair.key_pem, 0o600)
    _write(directory / cert_name, pair.cert_pem, 0o644)


def generate_files(
    out: Path, dns_names: Iterable[str], ips: Iterable[str] = (), days: int = 365
) -> tuple[Path, Path, Path]:
    """A new CA and serving pair in ``out``; returns (ca.crt, tls.crt, tls.key)."""
    ca = generate_ca(days=max(days, 3650))
    serving = generate_serving(ca, list(dict.fromkeys(dns_names)), list(dict.fromkeys(ips)), days=days)
    write_pair(out, ca, CA_CERT, CA_KEY)
    write_pair(out, serving, TLS_CERT, TLS_KEY)
    return out / CA_CERT, out / TLS_CERT, out / TLS_KEY


def not_after(cert_pem: bytes) -> dt.datetime:
    """When the first certificate in a PEM bundle expires."""
    try:
        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except ValueError as exc:
        raise CertificateError(f"not a PEM certificate: {exc}") from exc


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )

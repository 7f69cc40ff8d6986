"""Certificates: SANs Go clients check, key type and file modes, the CLI."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives import serialization

from webhook import certs, cli


def test_generate_cli_covers_every_service_name(tmp_path: Path) -> None:
    out = tmp_path / "c"
    assert cli.main(["certs", "generate", "--out", str(out), "--service", "hook", "--namespace", "gpu",
                     "--dns", "localhost", "--ip", "127.0.0.1", "--days", "30"]) == 0
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        "hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local", "localhost"
    }
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert 29 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 31
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    for key in ("tls.key", "ca.key"):
        assert stat.S_IMODE((out / key).stat().st_mode) == 0o600


def test_serving_certificate_chains_to_its_ca(tmp_path: Path) -> None:
    ca_path, cert_path, _ = certs.generate_files(tmp_path, ["svc.ns.svc"])
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca = certs.generate_ca(days=10)
    serving = certs.generate_serving(ca, ["x"], days=400)
    assert serving.certificate.not_valid_after_utc <= ca.certificate.not_valid_after_utc
    key = serialization.load_pem_private_key(serving.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)

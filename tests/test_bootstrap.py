"""`certs install` and `certs rotate` with the real kubernetes client against the fake API server."""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.fakeapi import FakeApiServer
from tests.support import REPO
from webhook import cli
from webhook.cluster import bootstrap

NS = "gpu-admission"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for name in ("mutatingwebhook.yaml", "validatingwebhook.yaml"):  # the shipped configurations
            server.add(yaml.safe_load((REPO / "deploy/base" / name).read_text()))
        yield server


def stored(api: FakeApiServer, kind: str, name: str, namespace: str = NS) -> dict[str, Any]:
    obj = api.get(kind, name, namespace)
    assert obj is not None, f"{kind} {name} missing"
    return obj


def secret(api: FakeApiServer, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in stored(api, "Secret", name)["data"].items()}


def bundles(api: FakeApiServer) -> set[bytes]:
    found: set[bytes] = set()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = api.get(kind, "gpu-admission", NS)
        assert config is not None
        found.update(base64.b64decode(w["clientConfig"]["caBundle"]) for w in config["webhooks"])
    return found


def certs_in(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle)


def trusted(cert_pem: bytes, bundle: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in certs_in(bundle):
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except Exception:
            continue
    return False


def test_install_creates_secrets_and_caBundle_and_is_idempotent(api: FakeApiServer) -> None:
    report = bootstrap.install(api.api_client(), bootstrap.Settings())
    assert len(report.changes) == 4, report.changes
    tls, ca = secret(api, "gpu-admission-tls"), secret(api, "gpu-admission-ca")
    assert stored(api, "Secret", "gpu-admission-tls")["type"] == "kubernetes.io/tls"
    assert "ca.key" not in tls, "the server's Secret must not carry the CA key"
    [bundle] = bundles(api)  # every webhook of both configurations has the same bundle
    assert bundle == ca["ca.crt"] and tls["ca.crt"] == ca["ca.crt"]
    assert trusted(tls["tls.crt"], bundle)
    sans = x509.load_pem_x509_certificate(tls["tls.crt"]).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "gpu-admission.gpu-admission.svc" in sans.value.get_values_for_type(x509.DNSName)

    versions = {k: stored(api, *k)["metadata"]["resourceVersion"] for k in (("Secret", "gpu-admission-tls", NS), ("Secret", "gpu-admission-ca", NS))}
    again = bootstrap.install(api.api_client(), bootstrap.Settings())
    assert again.changes == []
    assert versions == {k: stored(api, *k)["metadata"]["resourceVersion"] for k in versions}


def test_install_renews_what_is_due(api: FakeApiServer) -> None:
    bootstrap.install(api.api_client(), bootstrap.Settings())
    old = secret(api, "gpu-admission-tls")["tls.crt"]
    later = bootstrap.Settings(now=lambda: dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=340))
    report = bootstrap.install(api.api_client(), later)
    assert any("serving certificate" in c for c in report.changes)
    assert secret(api, "gpu-admission-tls")["tls.crt"] != old


def test_rotate_keeps_old_and_new_CA_trusted(api: FakeApiServer) -> None:
    bootstrap.install(api.api_client(), bootstrap.Settings())
    first_serving = secret(api, "gpu-admission-tls")["tls.crt"]
    bootstrap.rotate(api.api_client(), bootstrap.Settings())
    second_serving = secret(api, "gpu-admission-tls")["tls.crt"]
    assert second_serving != first_serving
    [bundle] = bundles(api)
    assert len(certs_in(bundle)) == 1, "a serving rotation keeps the CA"

    bootstrap.rotate(api.api_client(), bootstrap.Settings(), rotate_ca=True)
    [bundle] = bundles(api)
    assert len(certs_in(bundle)) == 2
    new_serving = secret(api, "gpu-admission-tls")["tls.crt"]
    # replicas still serving the old certificate and those with the new one are both trusted
    assert trusted(second_serving, bundle) and trusted(new_serving, bundle)
    assert secret(api, "gpu-admission-ca").get("previous-ca.crt")


def test_install_without_webhook_configurations_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeApiServer() as bare:
        bare.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        kubeconfig = write_kubeconfig(tmp_path, bare.url)
        assert cli.main(["certs", "install", "--kubeconfig", str(kubeconfig)]) == 1
    assert "apply deploy/ first" in capsys.readouterr().err


def test_cli_install_then_rotate(api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path, api.url)
    assert cli.main(["certs", "install", "--kubeconfig", str(kubeconfig)]) == 0
    assert "issued a serving certificate" in capsys.readouterr().out
    assert cli.main(["certs", "install", "--kubeconfig", str(kubeconfig)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert cli.main(["certs", "rotate", "--rotate-ca", "--kubeconfig", str(kubeconfig)]) == 0
    assert len(certs_in(next(iter(bundles(api))))) == 2


def write_kubeconfig(directory: Path, url: str) -> Path:
    config: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    os.chmod(path, 0o600)
    return path

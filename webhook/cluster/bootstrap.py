"""``certs install`` and ``certs rotate``: certificates in the cluster, caBundle on the webhooks.

Two Secrets, so the server never holds the CA key:

- ``gpu-admission-ca`` (Opaque): ``ca.crt``, ``ca.key`` and, after a CA
  rotation, ``previous-ca.crt``; only the bootstrap's ServiceAccount reads it;
- ``gpu-admission-tls`` (kubernetes.io/tls): ``tls.crt``, ``tls.key``,
  ``ca.crt``; mounted by the server, which reloads it on change.

The caBundle of both webhook configurations holds the current CA and, until
it expires, the previous one. A rotation writes the bundle with both CAs
first and the new serving certificate after, so whichever certificate a
replica serves while the Secret volume catches up, kube-apiserver trusts it.
Running ``install`` again changes nothing that is still good.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook import certs
from webhook.errors import ClusterError

CA_SECRET = "gpu-admission-ca"
TLS_SECRET = "gpu-admission-tls"
WEBHOOK_CONFIG = "gpu-admission"
PREVIOUS_CA = "previous-ca.crt"


@dataclass(frozen=True)
class Settings:
    namespace: str = "gpu-admission"
    service: str = "gpu-admission"
    webhook_config: str = WEBHOOK_CONFIG
    serving_days: int = 365
    ca_days: int = 3650
    renew_before_days: int = 30
    #: names beyond the Service's, for webhooks reached by clientConfig.url
    extra_dns: tuple[str, ...] = ()
    extra_ips: tuple[str, ...] = ()
    now: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.timezone.utc))


@dataclass
class Report:
    changes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(self.changes) if self.changes else "nothing to do: certificates and caBundle are current"


def install(api: client.ApiClient, settings: Settings, report: Report | None = None) -> Report:
    """Make sure a CA, a serving certificate and the caBundle are in place and current."""
    report = report or Report()
    core = client.CoreV1Api(api)
    ca_data = _read_secret(core, settings.namespace, CA_SECRET)
    ca = _pair(ca_data, certs.CA_CERT, certs.CA_KEY)
    previous = ca_data.get(PREVIOUS_CA) if ca_data else None
    if ca is None or _due(ca, settings):
        previous = ca.cert_pem if ca is not None else previous
        ca = certs.generate_ca(days=settings.ca_days, now=settings.now())
        _write_ca(core, settings, ca, previous, exists=ca_data is not None)
        report.changes.append(f"created a new CA in Secret {settings.namespace}/{CA_SECRET}")
    bundle = _bundle(ca.cert_pem, previous, settings)
    _patch_ca_bundles(api, settings, bundle, report)
    tls_data = _read_secret(core, settings.namespace, TLS_SECRET)
    serving = _pair(tls_data, certs.TLS_CERT, certs.TLS_KEY)
    if serving is None or _due(serving, settings) or not _fits(serving, ca, settings):
        _write_serving(core, settings, ca, exists=tls_data is not None)
        report.changes.append(f"issued a serving certificate in Secret {settings.namespace}/{TLS_SECRET}")
    return report


def rotate(api: client.ApiClient, settings: Settings, *, rotate_ca: bool = False) -> Report:
    """A new serving certificate now; a new CA too when asked or due (old CA kept in the bundle)."""
    report = Report()
    core = client.CoreV1Api(api)
    ca_data = _read_secret(core, settings.namespace, CA_SECRET)
    ca = _pair(ca_data, certs.CA_CERT, certs.CA_KEY)
    if ca is None:
        return install(api, settings, report)
    previous = ca_data.get(PREVIOUS_CA) if ca_data else None
    if rotate_ca or _due(ca, settings):
        previous, ca = ca.cert_pem, certs.generate_ca(days=settings.ca_days, now=settings.now())
        _write_ca(core, settings, ca, previous, exists=True)
        report.changes.append(f"created a new CA in Secret {settings.namespace}/{CA_SECRET}; the old one stays trusted")
    _patch_ca_bundles(api, settings, _bundle(ca.cert_pem, previous, settings), report)
    _write_serving(core, settings, ca, exists=_read_secret(core, settings.namespace, TLS_SECRET) is not None)
    report.changes.append(f"issued a serving certificate in Secret {settings.namespace}/{TLS_SECRET}")
    return report


def _read_secret(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, bytes] | None:
    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise ClusterError(f"cannot read Secret {namespace}/{name}: {exc.status} {exc.reason}") from exc
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _pair(data: dict[str, bytes] | None, cert_key: str, key_key: str) -> certs.KeyPair | None:
    if not data or cert_key not in data or key_key not in data:
        return None
    try:
        pair = certs.KeyPair(data[cert_key], data[key_key])
        pair.certificate  # noqa: B018 - parse now, so a corrupt Secret is replaced
    except ValueError:
        return None
    return pair


def _due(pair: certs.KeyPair, settings: Settings) -> bool:
    remaining = pair.certificate.not_valid_after_utc - settings.now()
    return remaining < dt.timedelta(days=settings.renew_before_days)


def _fits(serving: certs.KeyPair, ca: certs.KeyPair, settings: Settings) -> bool:
    """Signed by this CA and naming every Service name and extra name."""
    cert = serving.certificate
    try:
        cert.verify_directly_issued_by(ca.certificate)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        ips = {ipaddress.ip_address(ip) for ip in settings.extra_ips}
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return set(_dns_names(settings)) <= set(sans.get_values_for_type(x509.DNSName)) and ips <= set(
        sans.get_values_for_type(x509.IPAddress)
    )


def _dns_names(settings: Settings) -> list[str]:
    return list(dict.fromkeys([*certs.service_names(settings.service, settings.namespace), *settings.extra_dns]))


def _bundle(current: bytes, previous: bytes | None, settings: Settings) -> bytes:
    parts = [current]
    if previous and previous != current:
        try:
            expired = x509.load_pem_x509_certificate(previous).not_valid_after_utc <= settings.now()
        except ValueError:
            expired = True
        if not expired:
            parts.append(previous)
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)


def _secret(name: str, namespace: str, kind: str, data: dict[str, bytes]) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels={"app.kubernetes.io/name": "gpu-admission"}),
        type=kind,
        data={k: base64.b64encode(v).decode() for k, v in data.items()},
    )


def _save(core: client.CoreV1Api, namespace: str, name: str, body: client.V1Secret, exists: bool) -> None:
    try:
        if exists:
            core.replace_namespaced_secret(name, namespace, body)
        else:
            core.create_namespaced_secret(namespace, body)
    except ApiException as exc:
        raise ClusterError(f"cannot write Secret {namespace}/{name}: {exc.status} {exc.reason}") from exc


def _write_ca(core: client.CoreV1Api, settings: Settings, ca: certs.KeyPair, previous: bytes | None, *, exists: bool) -> None:
    data = {certs.CA_CERT: ca.cert_pem, certs.CA_KEY: ca.key_pem}
    if previous:
        data[PREVIOUS_CA] = previous
    _save(core, settings.namespace, CA_SECRET, _secret(CA_SECRET, settings.namespace, "Opaque", data), exists)


def _write_serving(core: client.CoreV1Api, settings: Settings, ca: certs.KeyPair, *, exists: bool) -> None:
    serving = certs.generate_serving(
        ca, _dns_names(settings), list(dict.fromkeys(settings.extra_ips)), days=settings.serving_days, now=settings.now()
    )
    data = {certs.TLS_CERT: serving.cert_pem, certs.TLS_KEY: serving.key_pem, certs.CA_CERT: ca.cert_pem}
    body = _secret(TLS_SECRET, settings.namespace, "kubernetes.io/tls", data)
    _save(core, settings.namespace, TLS_SECRET, body, exists)


def _patch_ca_bundles(api: client.ApiClient, settings: Settings, bundle: bytes, report: Report) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    encoded = base64.b64encode(bundle).decode()
    pairs: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
        ("MutatingWebhookConfiguration", admission.read_mutating_webhook_configuration,
         admission.replace_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", admission.read_validating_webhook_configuration,
         admission.replace_validating_webhook_configuration),
    ]
    for kind, read, replace in pairs:
        try:
            config = read(settings.webhook_config)
        except ApiException as exc:
            raise ClusterError(
                f"cannot read {kind} {settings.webhook_config}: {exc.status} {exc.reason} (apply deploy/ first)"
            ) from exc
        stale = [w for w in config.webhooks or [] if w.client_config.ca_bundle != encoded]
        if not stale:
            continue
        for webhook in stale:
            webhook.client_config.ca_bundle = encoded
        try:
            replace(settings.webhook_config, config)  # carries resourceVersion: a concurrent edit fails, not lost
        except ApiException as exc:
            raise ClusterError(f"cannot update {kind} {settings.webhook_config}: {exc.status} {exc.reason}") from exc
        report.changes.append(f"set the caBundle of {len(stale)} webhook(s) in {kind} {settings.webhook_config}")

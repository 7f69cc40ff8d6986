"""The cert-manager overlay issues the serving certificate the server mounts
and injects its CA into both webhook configurations."""

from __future__ import annotations

import yaml

import deploy_tree
from deploy_tree import DEPLOY, NAMESPACE

OVERLAY = DEPLOY / "cert-manager"
DOCS = deploy_tree.resolve(OVERLAY)
SERVICE_NAMES = [
    "gpu-admission",
    f"gpu-admission.{NAMESPACE}",
    f"gpu-admission.{NAMESPACE}.svc",
    f"gpu-admission.{NAMESPACE}.svc.cluster.local",
]


def _issuer(name: str) -> dict:
    return deploy_tree.one("Issuer", name, docs=DOCS)["spec"]


def test_overlay_is_the_base_plus_certificates() -> None:
    assert "../base" in deploy_tree.kustomization(OVERLAY)["resources"]
    assert not any(d.kind in ("Job", "CronJob") for d in DOCS), "not with the bootstrap Job"


def test_issuer_chain_self_signed_to_ca_to_serving() -> None:
    serving = deploy_tree.one("Certificate", "gpu-admission-serving", docs=DOCS)["spec"]
    ca_issuer = _issuer(serving["issuerRef"]["name"])
    ca_cert = next(d.body["spec"] for d in DOCS if d.kind == "Certificate"
                   and d.body["spec"]["secretName"] == ca_issuer["ca"]["secretName"])
    assert ca_cert["isCA"] is True
    root = _issuer(ca_cert["issuerRef"]["name"])
    assert "selfSigned" in root
    assert not serving.get("isCA")
    # Renewing the CA must not change its key, or older serving certs stop verifying.
    assert ca_cert["privateKey"]["rotationPolicy"] == "Never"


def test_serving_certificate_is_the_mounted_secret_and_names_the_service() -> None:
    serving = deploy_tree.one("Certificate", "gpu-admission-serving", docs=DOCS)["spec"]
    assert serving["secretName"] == "gpu-admission-tls"
    assert set(SERVICE_NAMES) <= set(serving["dnsNames"])
    assert "server auth" in serving["usages"]
    deployment = deploy_tree.one("Deployment", "gpu-admission", docs=DOCS)
    secrets = {v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    assert serving["secretName"] in secrets


def test_ca_is_injected_into_both_webhook_configurations() -> None:
    patched = {}
    for entry in deploy_tree.kustomization(OVERLAY)["patches"]:
        patch = yaml.safe_load(entry["patch"])
        patched[patch["kind"]] = patch["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert set(patched) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for value in patched.values():
        namespace, name = value.split("/")
        assert deploy_tree.one("Certificate", name, docs=DOCS)["metadata"]["namespace"] == namespace

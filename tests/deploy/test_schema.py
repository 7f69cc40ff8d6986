"""Every object under deploy/ is well-formed for the API server that receives it.

Built-in kinds are validated against the Kubernetes OpenAPI schemas that
kubernetes-validate ships, in strict mode (an unknown or misspelt field
fails). Two fixed versions: the oldest schema the package ships (nearest to
the 1.30 minimum docs/deploy.md states) and the newest. Custom resources
(prometheus-operator, cert-manager) are not in those schemas: they are
checked structurally below, with their known fields only.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import kubernetes_validate
import pytest

import deploy_tree
from deploy_tree import CLUSTER_SCOPED, NAMESPACE, Doc

KUBE_VERSIONS = ("1.33.0", "1.37.0")

DOCS = deploy_tree.manifests()
GENERATED = [
    (str(folder.relative_to(deploy_tree.REPO)), cm)
    for folder in deploy_tree.kustomization_dirs()
    for cm in deploy_tree.generated_configmaps(folder)
]


# Structural checks of custom resources: required fields present, no field
# outside the documented set (what strict schema validation does for the
# built-in kinds).

_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(h|m|s))+$")


def _only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    assert isinstance(obj, dict), f"{where}: expected a mapping"
    unknown = set(obj) - allowed
    assert not unknown, f"{where}: unknown fields {sorted(unknown)}"


def _selector(sel: dict[str, Any], where: str) -> None:
    _only(sel, {"matchLabels", "matchExpressions"}, where)
    assert sel, f"{where}: empty selector selects everything"


def _check_servicemonitor(body: dict[str, Any]) -> None:
    spec = body["spec"]
    _only(spec, {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                 "podTargetLabels", "sampleLimit", "attachMetadata"}, "spec")
    _selector(spec["selector"], "spec.selector")
    _only(spec.get("namespaceSelector", {}), {"matchNames", "any"}, "spec.namespaceSelector")
    assert spec["endpoints"], "spec.endpoints is empty"
    for ep in spec["endpoints"]:
        _only(ep, {"port", "targetPort", "scheme", "path", "interval", "scrapeTimeout",
                   "honorLabels", "honorTimestamps", "tlsConfig", "relabelings",
                   "metricRelabelings", "authorization", "bearerTokenSecret", "params"},
              "spec.endpoints[]")
        assert ep.get("scheme", "http") in ("http", "https")
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                assert _DURATION.match(ep[key]), f"{key}: {ep[key]!r}"
        tls = ep.get("tlsConfig", {})
        _only(tls, {"serverName", "ca", "cert", "keySecret", "insecureSkipVerify"}, "tlsConfig")
        for key in ("ca", "cert"):
            if key in tls:
                _only(tls[key], {"secret", "configMap"}, f"tlsConfig.{key}")
                ref = tls[key].get("secret") or tls[key].get("configMap")
                _only(ref, {"name", "key", "optional"}, f"tlsConfig.{key} reference")
                assert ref.get("name") and ref.get("key"), f"tlsConfig.{key} needs name and key"


def _check_prometheusrule(body: dict[str, Any]) -> None:
    spec = body["spec"]
    _only(spec, {"groups"}, "spec")
    names = [g["name"] for g in spec["groups"]]
    assert len(names) == len(set(names)), "rule group names must be unique"
    for group in spec["groups"]:
        _only(group, {"name", "interval", "rules", "partial_response_strategy", "limit"}, "group")
        assert group["rules"], f"group {group['name']} is empty"
        for rule in group["rules"]:
            _only(rule, {"alert", "record", "expr", "for", "keep_firing_for", "labels",
                         "annotations"}, f"rule in {group['name']}")
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "for" in rule:
                assert _DURATION.match(rule["for"]), rule["for"]


def _check_issuer(body: dict[str, Any]) -> None:
    spec = body["spec"]
    issuer_types = {"selfSigned", "ca", "acme", "vault", "venafi"}
    _only(spec, issuer_types, "spec")
    assert len(spec) == 1, f"an Issuer has exactly one type, got {sorted(spec)}"
    if "ca" in spec:
        _only(spec["ca"], {"secretName", "crlDistributionPoints", "ocspServers",
                           "issuingCertificateURLs"}, "spec.ca")
        assert spec["ca"]["secretName"]
    if "selfSigned" in spec:
        _only(spec["selfSigned"] or {}, {"crlDistributionPoints"}, "spec.selfSigned")


_USAGES = {"signing", "digital signature", "content commitment", "key encipherment",
           "key agreement", "data encipherment", "cert sign", "crl sign",
           "encipher only", "decipher only", "any", "server auth", "client auth",
           "code signing", "email protection", "s/mime", "ipsec end system",
           "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
           "microsoft sgc", "netscape sgc"}


def _check_certificate(body: dict[str, Any]) -> None:
    spec = body["spec"]
    _only(spec, {"secretName", "secretTemplate", "commonName", "dnsNames", "ipAddresses",
                 "uris", "emailAddresses", "subject", "duration", "renewBefore",
                 "renewBeforePercentage", "isCA", "usages", "privateKey", "issuerRef",
                 "revisionHistoryLimit", "keystores", "additionalOutputFormats",
                 "encodeUsagesInRequest", "literalSubject", "nameConstraints",
                 "otherNames"}, "spec")
    assert spec["secretName"]
    _only(spec["issuerRef"], {"name", "kind", "group"}, "spec.issuerRef")
    assert spec["issuerRef"]["name"]
    assert spec["issuerRef"].get("kind", "Issuer") in ("Issuer", "ClusterIssuer")
    for key in ("duration", "renewBefore"):
        if key in spec:
            assert _DURATION.match(spec[key]), f"{key}: {spec[key]!r}"
    key_spec = spec.get("privateKey", {})
    _only(key_spec, {"algorithm", "size", "encoding", "rotationPolicy"}, "spec.privateKey")
    assert key_spec.get("algorithm", "RSA") in ("RSA", "ECDSA", "Ed25519")
    assert key_spec.get("rotationPolicy", "Never") in ("Never", "Always")
    assert set(spec.get("usages", [])) <= _USAGES, spec.get("usages")
    assert spec.get("dnsNames") or spec.get("commonName") or spec.get("isCA")


CUSTOM_CHECKS: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _check_servicemonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): _check_prometheusrule,
    ("cert-manager.io/v1", "Issuer"): _check_issuer,
    ("cert-manager.io/v1", "Certificate"): _check_certificate,
}
CUSTOM_GROUPS = {api.split("/")[0] for api, _ in CUSTOM_CHECKS}


def _is_custom(body: dict[str, Any]) -> bool:
    return str(body.get("apiVersion", "")).split("/")[0] in CUSTOM_GROUPS


def test_there_is_something_to_check() -> None:
    kinds = {d.kind for d in DOCS}
    assert {"Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
            "ServiceMonitor", "Certificate", "ValidatingAdmissionPolicy"} <= kinds


#: kinds the oldest schema does not have: deploy/compiled/ (Kubernetes 1.36 and later) ships them
_NEWER = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


@pytest.mark.parametrize(("doc", "version"), [
    (d, v) for d in DOCS if not _is_custom(d.body) for v in KUBE_VERSIONS if d.kind not in _NEWER or v == KUBE_VERSIONS[-1]
], ids=lambda x: x.where if isinstance(x, Doc) else x)
def test_builtin_kinds_match_the_openapi_schema(doc: Doc, version: str) -> None:
    try:
        kubernetes_validate.validate(doc.body, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        pytest.fail(f"{doc.where}: {doc.kind} invalid for Kubernetes {version} at {path}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(f"{doc.where}: {exc.message} (a custom resource needs a structural check here)")


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("where,configmap", GENERATED, ids=[w for w, _ in GENERATED])
def test_generated_configmaps_match_the_openapi_schema(where: str, configmap: dict, version: str) -> None:
    kubernetes_validate.validate(configmap, version, strict=True)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.where)
def test_every_object_names_itself_and_its_namespace(doc: Doc) -> None:
    meta = doc.body.get("metadata", {})
    assert doc.body.get("apiVersion") and doc.kind and meta.get("name"), doc.where
    if doc.kind in CLUSTER_SCOPED:
        assert "namespace" not in meta, f"{doc.where}: {doc.kind} is cluster-scoped"
    else:
        # No kustomize namespace transformer: the namespace is written out.
        assert meta.get("namespace") == NAMESPACE, f"{doc.where}: namespace must be {NAMESPACE}"
    if doc.kind != "CustomResourceDefinition":  # the report CRDs are vendored unchanged (deploy/reports/crds)
        assert meta.get("labels", {}).get("app.kubernetes.io/part-of") == "gpu-admission", doc.where


def test_no_object_is_defined_twice_in_one_kustomization() -> None:
    for folder in deploy_tree.kustomization_dirs():
        seen: dict[tuple[str, str, str], str] = {}
        for doc in deploy_tree.resolve(folder):
            key = (doc.kind, doc.body["metadata"].get("namespace", ""), doc.name)
            assert key not in seen, f"{key} in both {seen[key]} and {doc.where}"
            seen[key] = doc.where



@pytest.mark.parametrize("doc", [d for d in DOCS if _is_custom(d.body)], ids=lambda d: d.where)
def test_custom_resources_are_structurally_valid(doc: Doc) -> None:
    check = CUSTOM_CHECKS.get((doc.body["apiVersion"], doc.kind))
    assert check, f"{doc.where}: no structural check for {doc.body['apiVersion']} {doc.kind}"
    _only(doc.body, {"apiVersion", "kind", "metadata", "spec"}, doc.where)
    _only(doc.body["metadata"], {"name", "namespace", "labels", "annotations"}, doc.where)
    check(doc.body)

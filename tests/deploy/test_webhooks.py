"""The webhook configurations are safe by default and reach the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deploy_tree
import pytest
import yaml
from deploy_tree import NAMESPACE

from webhook.kube.workload import BUILTIN_KINDS

BASE = deploy_tree.base()
MUTATING = deploy_tree.one("MutatingWebhookConfiguration", docs=BASE)
VALIDATING = deploy_tree.one("ValidatingWebhookConfiguration", docs=BASE)
CONFIGS = {"mutating": MUTATING, "validating": VALIDATING}
WEBHOOKS = [(kind, hook) for kind, cfg in CONFIGS.items() for hook in cfg["webhooks"]]
IDS = [hook["name"] for _, hook in WEBHOOKS]

OPT_IN = "gpu-admission.io/enabled"
REPO_ROOT = Path(__file__).resolve().parents[2]
NEVER = {"kube-system", "kube-public", "kube-node-lease", NAMESPACE}

#: (group, resource) the shipped policies cover, and the versions to match.
COVERED: dict[tuple[str, str], set[str]] = {
    **{("", r): {"v1"} for r in ("pods", "replicationcontrollers", "podtemplates")},
    **{("apps", r): {"v1"} for r in ("deployments", "statefulsets", "daemonsets", "replicasets")},
    **{("batch", r): {"v1"} for r in ("jobs", "cronjobs")},
    **{("kubeflow.org", r): {"*"} for r in
       ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs", "mxjobs")},
    **{("ray.io", r): {"*"} for r in ("rayclusters", "rayjobs", "rayservices")},
    ("jobset.x-k8s.io", "jobsets"): {"*"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"*"},
    ("serving.kserve.io", "inferenceservices"): {"*"},
}
#: DRA claims: validated where they are written; nothing about them is mutated
CLAIMS: dict[tuple[str, str], set[str]] = {("resource.k8s.io", r): {"*"} for r in ("resourceclaims", "resourceclaimtemplates")}


def test_every_shipped_workload_kind_reaches_both_webhooks() -> None:
    """A kind the policies know (built in, or described in policies/workload-kinds.yaml) is
    useless unless the API server sends it."""
    kinds = [d["spec"] for d in yaml.safe_load_all((REPO_ROOT / "policies/workload-kinds.yaml").read_text()) if d]
    wanted = {(k["group"], k["kind"].lower() + "s") for k in kinds}
    wanted |= {(k.group, k.kind.lower() + "s") for k in BUILTIN_KINDS}
    assert wanted <= set(COVERED), wanted - set(COVERED)


def _selected(hook: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    """Whether the namespaceSelector selects a namespace (the API server adds
    kubernetes.io/metadata.name to every namespace)."""
    all_labels = {**labels, "kubernetes.io/metadata.name": name}
    return deploy_tree.labels_match(hook["namespaceSelector"], all_labels)


def test_names_and_paths() -> None:
    assert [h["name"] for h in MUTATING["webhooks"]] == ["mutate.gpu-admission.io"]
    assert [h["name"] for h in VALIDATING["webhooks"]] == ["validate.gpu-admission.io"]
    assert MUTATING["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate"
    assert VALIDATING["webhooks"][0]["clientConfig"]["service"]["path"] == "/validate"


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_the_service_reference_reaches_the_server_port(kind: str, hook: dict[str, Any]) -> None:
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref.get("port", 443)) == ("gpu-admission", NAMESPACE, 443)
    assert "url" not in hook["clientConfig"]
    service = deploy_tree.one("Service", "gpu-admission", docs=BASE)
    port = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    pod = deploy_tree.one("Deployment", "gpu-admission", docs=BASE)["spec"]["template"]["spec"]
    container_ports = {p.get("name"): p["containerPort"] for c in pod["containers"]
                       for p in c.get("ports", [])}
    target = port["targetPort"]
    assert container_ports.get(target, target) == 8443


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_ca_bundle_is_left_to_the_bootstrap(kind: str, hook: dict[str, Any]) -> None:
    # Absent, not "": a re-apply must not blank what the bootstrap filled in.
    assert "caBundle" not in hook["clientConfig"]


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_namespace_selector_requires_opt_in_and_spares_the_system(kind: str, hook: dict[str, Any]) -> None:
    exprs = hook["namespaceSelector"].get("matchExpressions", [])
    assert {"key": OPT_IN, "operator": "In", "values": ["true"]} in exprs
    by_name = [e for e in exprs if e["key"] == "kubernetes.io/metadata.name"]
    assert len(by_name) == 1 and by_name[0]["operator"] == "NotIn"
    assert NEVER <= set(by_name[0]["values"])
    # Behaviour, not just spelling:
    assert _selected(hook, "team-a", {OPT_IN: "true"})
    assert not _selected(hook, "team-a", {})
    assert not _selected(hook, "team-a", {OPT_IN: "false"})
    for name in NEVER:
        assert not _selected(hook, name, {OPT_IN: "true"}), name
    assert "objectSelector" not in hook or not hook["objectSelector"], \
        "an object label could let a tenant opt out (break-glass must not be a tenant label)"


def test_own_namespace_says_it_is_not_opted_in() -> None:
    ns = deploy_tree.one("Namespace", NAMESPACE, docs=BASE)
    assert ns["metadata"]["labels"].get(OPT_IN) != "true"


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_contract_with_the_api_server(kind: str, hook: dict[str, Any]) -> None:
    assert hook["admissionReviewVersions"] == ["v1"]
    # the validating webhook writes the GPU quota ledger, never on a dry run (docs/quota.md)
    assert hook["sideEffects"] == ("NoneOnDryRun" if kind == "validating" else "None")
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["failurePolicy"] == "Fail"  # validate: required; mutate: docs/deploy.md


def test_mutating_webhook_is_reinvoked() -> None:
    assert MUTATING["webhooks"][0]["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_rules_cover_exactly_the_policy_resources(kind: str, hook: dict[str, Any]) -> None:
    covered: dict[tuple[str, str], set[str]] = {}
    rules = hook["rules"]
    if kind == "validating":
        # debug containers (issue #42): UPDATE of the one pod subresource gpuAccess judges, nothing else
        assert DEBUG_CONTAINERS in rules
        rules = [r for r in rules if r != DEBUG_CONTAINERS]
    for rule in rules:
        assert sorted(rule["operations"]) == ["CREATE", "UPDATE"], rule
        assert rule.get("scope") == "Namespaced", rule
        assert "*" not in rule["apiGroups"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in resource and "/" not in resource, \
                    f"{resource}: no wildcards, no subresources"
                covered.setdefault((group, resource), set()).update(rule["apiVersions"])
    assert covered == (COVERED if kind == "mutating" else {**COVERED, **CLAIMS})


DEBUG_CONTAINERS = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                    "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}


def test_both_webhooks_select_the_same_requests() -> None:
    mutate, validate = MUTATING["webhooks"][0], VALIDATING["webhooks"][0]
    for field in ("namespaceSelector", "matchPolicy"):
        assert mutate[field] == validate[field], field
    # the same conditions, but for the debug containers only the validating webhook is sent
    subresources = [c for c in validate["matchConditions"] if c["name"] == "exclude-subresources"]
    assert [c for c in validate["matchConditions"] if c not in subresources] == \
        [c for c in mutate["matchConditions"] if c["name"] != "exclude-subresources"]
    assert "ephemeralcontainers" in subresources[0]["expression"]
    # the same rules, but for the claims and debug containers only the validating webhook looks at
    claim_rules = [r for r in validate["rules"] if r["apiGroups"] == ["resource.k8s.io"]]
    assert [r for r in validate["rules"] if r not in claim_rules and r != DEBUG_CONTAINERS] == mutate["rules"]
    assert len(claim_rules) == 1


@pytest.mark.parametrize("kind,hook", WEBHOOKS, ids=IDS)
def test_match_conditions_are_well_formed(kind: str, hook: dict[str, Any]) -> None:
    conditions = hook["matchConditions"]
    names = [c["name"] for c in conditions]
    assert len(names) == len(set(names)) and len(names) <= 64
    for condition in conditions:
        assert set(condition) == {"name", "expression"}
        assert len(condition["name"]) <= 63
        # matchConditions see object, oldObject, request and authorizer only.
        for var in ("params", "variables", "namespaceObject"):
            assert f"{var}." not in condition["expression"], (condition["name"], var)

"""The server may only read the resources its cluster index watches, and write the GPU quota
ledger in its own namespace; the certificate Job may only touch its own Secret and the two
webhook configurations."""

from __future__ import annotations

from typing import Any

import deploy_tree
from deploy_tree import NAMESPACE

BASE = deploy_tree.base()
BOOTSTRAP = deploy_tree.resolve(deploy_tree.DEPLOY / "bootstrap")
READ = ["get", "list", "watch"]
SERVER_READS = {
    ("", "nodes"), ("", "namespaces"), ("", "pods"), ("", "resourcequotas"),
    ("scheduling.k8s.io", "priorityclasses"), ("node.k8s.io", "runtimeclasses"),
    ("resource.k8s.io", "deviceclasses"), ("resource.k8s.io", "resourceclaimtemplates"),
    ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "resourceslices"),
}


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str, tuple[str, ...]], set[str]]:
    """(group, resource, resourceNames) -> verbs, wildcards refused."""
    grants: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, \
            f"no nonResourceURLs: {rule}"
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource, tuple(sorted(rule.get("resourceNames", []))))
                grants.setdefault(key, set()).update(rule["verbs"])
    return grants


def _bound_roles(account: str) -> list[tuple[str, str]]:
    """(kind, name) of every role any binding under deploy/ gives the account."""
    bound = []
    for doc in deploy_tree.manifests():
        if doc.kind in ("RoleBinding", "ClusterRoleBinding"):
            for subject in doc.body["subjects"]:
                if (subject["kind"], subject["name"], subject.get("namespace")) == \
                        ("ServiceAccount", account, NAMESPACE):
                    bound.append((doc.body["roleRef"]["kind"], doc.body["roleRef"]["name"]))
    return bound


def test_server_role_reads_exactly_the_indexed_resources() -> None:
    role = deploy_tree.one("ClusterRole", "gpu-admission", docs=BASE)
    grants = _grants(role["rules"])
    assert {(g, r) for g, r, _ in grants} == SERVER_READS
    for (group, resource, names), verbs in grants.items():
        assert sorted(verbs) == READ, f"{group}/{resource}: {sorted(verbs)}"
        assert not names


def test_the_role_covers_what_the_index_watches() -> None:
    from webhook.cluster.kinds import KINDS

    watched = {(k.api_version.rpartition("/")[0], k.resource) for k in KINDS.values()}
    assert watched == SERVER_READS


def test_server_writes_only_the_quota_ledger_and_only_in_its_namespace() -> None:
    role = deploy_tree.one("Role", "gpu-admission-quota-ledger", docs=BASE)
    assert role["metadata"]["namespace"] == NAMESPACE
    from webhook.ledger import document

    assert _grants(role["rules"]) == {
        (document.GROUP, document.PLURAL, ()): {"get", "list", "watch", "create", "update", "patch"}}
    crd = deploy_tree.one("CustomResourceDefinition", f"{document.PLURAL}.{document.GROUP}", docs=BASE)
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["names"]["kind"] == document.KIND
    # no other role anywhere under deploy/ may change the ledger (editing it would free quota); the
    # report's reads it, in its namespace (charges in flight hold GPUs too)
    for doc in deploy_tree.manifests():
        if doc.kind in ("Role", "ClusterRole") and doc.name != "gpu-admission-quota-ledger":
            for rule in doc.body.get("rules") or []:
                if document.PLURAL in rule.get("resources", []) or "*" in rule.get("resources", []):
                    assert (doc.kind, doc.name, doc.body["metadata"].get("namespace")) == \
                        ("Role", "gpu-admission-report", NAMESPACE), doc.where
                    assert set(rule["verbs"]) <= {"get", "list"} and rule["resources"] == [document.PLURAL], doc.where
        labels = (doc.body.get("metadata") or {}).get("labels") or {}
        assert not any(k.startswith("rbac.authorization.k8s.io/aggregate-to") for k in labels), doc.where


def test_server_account_has_those_roles_and_nothing_else() -> None:
    assert sorted(_bound_roles("gpu-admission")) == [("ClusterRole", "gpu-admission"),
                                                     ("Role", "gpu-admission-quota-ledger")]
    deployment = deploy_tree.one("Deployment", "gpu-admission", docs=BASE)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-admission"


def test_no_role_under_deploy_has_wildcards_or_escalation_verbs() -> None:
    for doc in deploy_tree.manifests():
        if doc.kind in ("Role", "ClusterRole"):
            verbs = set().union(*(set(v) for v in _grants(doc.body["rules"]).values()))
            assert not verbs & {"escalate", "bind", "impersonate", "delete", "deletecollection"}, \
                doc.where


def test_certificate_job_may_touch_only_its_secret_and_webhook_configs() -> None:
    role = _grants(deploy_tree.one("Role", "gpu-admission-certs", docs=BOOTSTRAP)["rules"])
    assert role == {
        ("", "secrets", ("gpu-admission-ca", "gpu-admission-tls")): {"get", "update", "patch"},
        # Create cannot be limited by name in RBAC; the Role is namespaced.
        ("", "secrets", ()): {"create"},
    }
    cluster = _grants(deploy_tree.one("ClusterRole", "gpu-admission-certs", docs=BOOTSTRAP)["rules"])
    names = tuple(sorted({deploy_tree.one(k, docs=BASE)["metadata"]["name"] for k in
                          ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")}))
    group = "admissionregistration.k8s.io"
    assert cluster == {
        (group, "mutatingwebhookconfigurations", names): {"get", "update", "patch"},
        (group, "validatingwebhookconfigurations", names): {"get", "update", "patch"},
    }
    assert sorted(_bound_roles("gpu-admission-certs")) == [
        ("ClusterRole", "gpu-admission-certs"), ("Role", "gpu-admission-certs")]
    # The Secret it writes is the one the server mounts.
    assert ("", "secrets", ("gpu-admission-ca", "gpu-admission-tls")) in role


def test_certificate_job_runs_the_install_command() -> None:
    job = deploy_tree.one("Job", "gpu-admission-certs-install", docs=BOOTSTRAP)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-admission-certs"
    (container,) = pod["containers"]
    assert container["command"] + container["args"] == [
        "gpu-admission", "certs", "install", "--namespace", NAMESPACE, "--service", "gpu-admission"]
    cron = deploy_tree.one("CronJob", "gpu-admission-certs-rotate", docs=BOOTSTRAP)
    (rotate,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert rotate["command"] + rotate["args"] == [
        "gpu-admission", "certs", "rotate", "--namespace", NAMESPACE, "--service", "gpu-admission"]
    assert cron["spec"]["suspend"] is True


def test_service_accounts_do_not_mount_tokens_unless_the_pod_asks() -> None:
    for doc in deploy_tree.manifests():
        if doc.kind == "ServiceAccount":
            assert doc.body.get("automountServiceAccountToken") is False, doc.where

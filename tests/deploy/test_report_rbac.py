"""deploy/reports: the report CronJob's account reads the cluster facts and the workload kinds the webhooks
receive, and writes the report kinds, nothing more; the CronJob runs `gpu-admission report` with the server's
policies."""

from __future__ import annotations

import deploy_tree
from deploy_tree import NAMESPACE
from test_rbac import SERVER_READS, _bound_roles, _grants

REPORTS = deploy_tree.resolve(deploy_tree.DEPLOY / "reports")
REPORT_KINDS = {("wgpolicyk8s.io", "policyreports"), ("wgpolicyk8s.io", "clusterpolicyreports"),
                ("openreports.io", "reports"), ("openreports.io", "clusterreports")}  # fmt: skip


def _webhook_resources() -> set[tuple[str, str]]:
    """(group, resource) of every kind the validating webhook receives, DRA claims left to the facts
    (subresources aside: pods/ephemeralcontainers is a pod's, and reports read pods)."""
    config = deploy_tree.one("ValidatingWebhookConfiguration", "gpu-admission", docs=deploy_tree.base())
    return {(group, resource) for hook in config["webhooks"] for rule in hook["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] if "/" not in resource}  # fmt: skip


def test_the_report_role_is_exactly_reads_and_report_writes() -> None:
    grants = _grants(deploy_tree.one("ClusterRole", "gpu-admission-report", docs=REPORTS)["rules"])
    by_resource = {(group, resource): verbs for (group, resource, names), verbs in grants.items() if not names}
    assert len(by_resource) == len(grants), "no resourceNames: reports are named per namespace"
    workloads = _webhook_resources() - SERVER_READS
    assert set(by_resource) == SERVER_READS | workloads | REPORT_KINDS
    for key, verbs in by_resource.items():
        if key in REPORT_KINDS:
            assert verbs == {"get", "list", "create", "patch"}, key  # server-side apply; no delete
        elif key in SERVER_READS:
            assert verbs == {"get", "list"}, key
        else:
            assert verbs == {"list"}, key
    assert sorted(_bound_roles("gpu-admission-report")) == [("ClusterRole", "gpu-admission-report"),
                                                            ("Role", "gpu-admission-report")]
    # in the webhook's namespace, the GPU quota ledgers, read (the charges in flight: docs/quota.md)
    from webhook.ledger import document

    role = deploy_tree.one("Role", "gpu-admission-report", docs=REPORTS)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _grants(role["rules"]) == {(document.GROUP, document.PLURAL, ()): {"get", "list"}}


def test_the_cronjob_runs_the_report_with_the_servers_policies() -> None:
    cron = deploy_tree.one("CronJob", "gpu-admission-report", docs=REPORTS)
    assert cron["metadata"]["namespace"] == NAMESPACE and cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-admission-report" and pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["command"] + container["args"] == [
        "gpu-admission", "report", "--in-cluster", "--policies", "/etc/gpu-admission/policies"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/gpu-admission/policies"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    server = deploy_tree.one("Deployment", "gpu-admission", docs=deploy_tree.base())["spec"]["template"]["spec"]
    assert volume["configMap"]["name"] in {v.get("configMap", {}).get("name") for v in server["volumes"]}

"""ServiceMonitor, alerts and dashboard use the server's real metrics and labels."""

from __future__ import annotations

import re
from typing import Any

import pytest

import deploy_tree
from deploy_tree import DEPLOY

MONITORING = deploy_tree.resolve(DEPLOY / "monitoring")
BASE = deploy_tree.base()

#: The server's metrics: name -> {label: allowed values or None for any}.
METRICS: dict[str, dict[str, set[str] | None]] = {
    "gpu_admission_requests_total": {
        "endpoint": None, "kind": None, "operation": None,
        "decision": {"allow", "patch", "deny", "warn", "error"}},
    "gpu_admission_request_duration_seconds": {"endpoint": None},
    "gpu_admission_policy_reloads_total": {"result": {"success", "error"}},
    "gpu_admission_policies_loaded": {},
    "gpu_admission_certificate_not_after_seconds": {"cert": {"serving", "client-ca"}},
    "gpu_admission_cluster_synced": {"resource": None},
    "gpu_admission_cluster_last_event_age_seconds": {"resource": None},
    "gpu_admission_cluster_relists_total": {"resource": None},
    "gpu_admission_cluster_watch_errors_total": {"resource": None},
    "gpu_admission_cluster_objects": {"resource": None},
}
HISTOGRAMS = {"gpu_admission_request_duration_seconds"}
#: Labels Prometheus adds on scrape.
TARGET_LABELS = {"namespace", "pod", "job", "instance", "service", "container"}
#: Labels a query may aggregate by: ours, Prometheus's, the histogram's le,
#: and the API server's webhook metrics' name and error_type.
GROUPING_LABELS = set().union(*(set(v) for v in METRICS.values())) | TARGET_LABELS | {
    "le", "name", "error_type"}
RESOURCES = {"nodes", "namespaces", "pods", "resourcequotas", "priorityclasses", "runtimeclasses"}

_SERIES = re.compile(r"\b(gpu_admission_[a-z_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _base_metric(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        stem = name.removesuffix(suffix)
        if stem != name and stem in HISTOGRAMS:
            return stem
    return name


def _check_promql(expr: str, where: str) -> int:
    """Fail on unknown metrics, labels or label values; return series count."""
    assert expr.count("(") == expr.count(")"), f"{where}: unbalanced parentheses"
    assert expr.count("{") == expr.count("}"), f"{where}: unbalanced braces"
    found = 0
    for name, selector in _SERIES.findall(expr):
        found += 1
        metric = _base_metric(name)
        assert metric in METRICS, f"{where}: {name} is not a metric the server exports"
        if name != metric:
            assert name.endswith(("_bucket", "_sum", "_count")), name
        elif metric in HISTOGRAMS:
            pytest.fail(f"{where}: use {name}_bucket/_sum/_count")
        labels = METRICS[metric]
        for label, op, value in _MATCHER.findall(selector or ""):
            if label in TARGET_LABELS:
                continue
            assert label in labels, f"{where}: {metric} has no label {label}"
            allowed = labels[label] or (RESOURCES if label == "resource" else None)
            if allowed and op in ("=", "!="):
                assert value in allowed, f"{where}: {metric}{{{label}={value!r}}} never exists"
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in (g.strip() for g in grouping.split(",") if g.strip()):
            assert label in GROUPING_LABELS, f"{where}: grouping by unknown label {label}"
    return found


def _rules() -> list[dict[str, Any]]:
    rule = deploy_tree.one("PrometheusRule", "gpu-admission", docs=MONITORING)
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


RULES = _rules()


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_alert_is_complete_and_uses_real_metrics(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    _check_promql(rule["expr"], rule["alert"])


def test_the_alerts_the_runbook_promises() -> None:
    by_metric: dict[str, list[str]] = {}
    for rule in RULES:
        for name, _ in _SERIES.findall(rule["expr"]):
            by_metric.setdefault(_base_metric(name), []).append(rule["expr"])
    errors = by_metric["gpu_admission_requests_total"]
    assert any('decision="error"' in e for e in errors), "error rate"
    assert any('decision="deny"' in e for e in errors), "denials spike"
    assert any("histogram_quantile(0.99" in e for e in by_metric["gpu_admission_request_duration_seconds"])
    assert any("14 * 86400" in e for e in by_metric["gpu_admission_certificate_not_after_seconds"])
    assert any("== 0" in e for e in by_metric["gpu_admission_cluster_synced"])
    assert by_metric["gpu_admission_cluster_last_event_age_seconds"], "stale cluster view"
    assert any("up{" in r["expr"] and "absent(" in r["expr"] for r in RULES), "all replicas down"


def test_servicemonitor_scrapes_the_plain_metrics_port() -> None:
    monitor = deploy_tree.one("ServiceMonitor", "gpu-admission", docs=MONITORING)["spec"]
    service = deploy_tree.one("Service", "gpu-admission", docs=BASE)
    assert deploy_tree.labels_match(monitor["selector"], service["metadata"]["labels"])
    assert monitor["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("http", "/metrics")
    # the server's --metrics-port: the TLS port no longer serves /metrics
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    server = deploy_tree.one("Deployment", "gpu-admission", docs=BASE)["spec"]["template"]["spec"]["containers"][0]
    args = server["args"]
    container_ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert container_ports[port["targetPort"]] == int(args[args.index("--metrics-port") + 1])
    # The server's metrics carry an "endpoint" label, which the operator's
    # target label of the same name would otherwise rename.
    assert endpoint["honorLabels"] is True
    assert "tlsConfig" not in endpoint


DASHBOARD = deploy_tree.dashboard()


def _panels() -> list[dict[str, Any]]:
    out = []
    for panel in DASHBOARD["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_dashboard_queries_use_real_metrics() -> None:
    exprs = [(p["title"], t["expr"]) for p in _panels() for t in p.get("targets", [])]
    assert exprs
    seen = set()
    for title, expr in exprs:
        _check_promql(expr, f"panel {title!r}")
        seen |= {_base_metric(n) for n, _ in _SERIES.findall(expr)}
    assert seen == set(METRICS), f"metrics without a panel: {set(METRICS) - seen}"


def test_dashboard_is_importable() -> None:
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in _panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_configmap_is_found_by_the_grafana_sidecar() -> None:
    (configmap,) = deploy_tree.generated_configmaps(DEPLOY / "monitoring")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (content,) = configmap["data"].values()
    assert content == (DEPLOY / "monitoring" / "gpu-admission-dashboard.json").read_text("utf-8")
    gen = deploy_tree.kustomization(DEPLOY / "monitoring")["configMapGenerator"][0]
    assert gen["options"]["disableNameSuffixHash"] is True

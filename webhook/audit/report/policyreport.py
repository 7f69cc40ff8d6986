"""``-o policyreport``: ``wgpolicyk8s.io/v1alpha2`` reports, as Kyverno writes them.

One ``PolicyReport`` per namespace and one ``ClusterPolicyReport`` for
cluster-scoped objects, objects whose namespace is no valid name (a
template left-over) and documents that could not be read, in a
``v1/List`` that ``kubectl apply -f`` and Policy Reporter take as it is.
It is written as JSON (which is YAML too), one result a line: PyYAML's
emitter takes seconds per thousand objects.
Each result names one policy rule on one resource: ``fail`` for an enforce
or audit finding (Kyverno records audit-mode violations as ``fail``),
``warn``, ``pass`` for a rule that found nothing (or only mutated),
``skip`` for a GPU-only policy on an object without GPUs and for a rule a
GPUPolicyException lifts, ``error`` for a
document that is not a Kubernetes object.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from webhook.audit.judge import Outcome, Result
from webhook.audit.report.run import TOOL, Report, dump_json

API_VERSION = "wgpolicyk8s.io/v1alpha2"
REPORT_NAME = "gpu-admission-audit"
_SEVERITY = {"enforce": "high", "warn": "medium", "audit": "low"}
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_STATUSES = ("pass", "fail", "warn", "error", "skip")


def render(report: Report) -> str:
    return dump_json(document(report), expand=4) + "\n"


def document(report: Report) -> dict[str, Any]:
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for result in report.results:
        namespace = result.request.namespace
        if not _NAMESPACE.match(namespace):
            namespace = ""  # not a namespace a report can live in (a template left-over): the cluster report
        entries = by_namespace.setdefault(namespace, [])
        entries.extend(_entry(report, result, o) for o in report.outcomes(result))
    cluster_entries = by_namespace.pop("", [])
    cluster_entries.extend(
        {
            "source": TOOL, "policy": TOOL, "rule": "read-manifest", "result": "error", "scored": True,
            "message": problem.text(), "timestamp": _timestamp(report),
            "properties": {"file": problem.source, "document": str(problem.index), "line": str(problem.line)},
        }
        for problem in report.problems
    )
    items = [_report("PolicyReport", entries, namespace) for namespace, entries in sorted(by_namespace.items())]
    if cluster_entries:
        items.append(_report("ClusterPolicyReport", cluster_entries, None))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _report(kind: str, results: list[dict[str, Any]], namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": REPORT_NAME, "labels": {"app.kubernetes.io/managed-by": TOOL}}
    if namespace is not None:
        metadata["namespace"] = namespace
    counts = Counter(r["result"] for r in results)
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "summary": {status: counts[status] for status in _STATUSES},
        "results": results,
    }


def _entry(report: Report, result: Result, outcome: Outcome) -> dict[str, Any]:
    doc, request = result.document, result.request
    resource: dict[str, Any] = {
        "apiVersion": str(doc.obj.get("apiVersion", "")),
        "kind": request.kind,
        "name": request.display_name,
    }
    if request.namespace:
        resource["namespace"] = request.namespace
    uid = (doc.obj.get("metadata") or {}).get("uid")
    if uid:
        resource["uid"] = str(uid)
    properties = {"mode": outcome.mode, "phase": outcome.phase, "file": doc.source, "document": str(doc.index)}
    return {
        "source": TOOL,
        "policy": outcome.policy,
        "rule": outcome.rule,
        "category": "GPU",
        "severity": _SEVERITY.get(outcome.mode, "info"),
        "result": outcome.status,
        "scored": True,
        "message": outcome.message,
        "timestamp": _timestamp(report),
        "resources": [resource],
        "properties": properties,
    }


def _timestamp(report: Report) -> dict[str, int]:
    return {"seconds": report.timestamp, "nanos": 0}

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from webhook.audit.judge import Outcome, Result
from webhook.audit.report.run import TOOL, Entries, Kept, Report, json_chunks, json_line

API_VERSION = "wgpolicyk8s.io/v1alpha2"
REPORT_NAME = "gpu-admission-audit"
MANAGED_BY = {"app.kubernetes.io/managed-by": TOOL}


@dataclass(frozen=True)
class ReportKinds:
    """A report API: wgpolicyk8s.io's PolicyReport, or its successor openreports.io's Report."""

    api_version: str
    namespaced: str  # the kind of a namespace's report
    cluster: str  # the kind of the cluster-scoped report
    plural: str
    cluster_plural: str
    #: openreports.io names the engine once per report too
    report_source: bool


WGPOLICY = ReportKinds(API_VERSION, "PolicyReport", "ClusterPolicyReport", "policyreports", "clusterpolicyreports", False)
OPENREPORTS = ReportKinds("openreports.io/v1alpha1", "Report", "ClusterReport", "reports", "clusterreports", True)
_SEVERITY = {"enforce": "high", "warn": "medium", "audit": "low"}
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_STATUSES = ("pass", "fail", "warn", "error", "skip")


def render(report: Report) -> str:
    return "".join(chunks(report))


def chunks(report: Report) -> Iterator[str]:
    """``render``'s text in pieces, to write as they come."""
    yield from json_chunks(document(report), expand=4)
    yield "\n"


def keep(report: Report, result: Result, kept: Kept) -> None:
    """One result's lines of its namespace's report, a policy rule each (``Report.keep``)."""
    namespace = _namespace_of(result)
    for outcome in report.outcomes(result):
        kept.put(json_line(_entry(report, result, outcome)), namespace, outcome.status)


def _namespace_of(result: Result) -> str:
    """Where the result is reported: its namespace, or "" (the cluster's report) when that is no
    namespace a report can live in (a template left-over)."""
    namespace = result.request.namespace
    return namespace if _NAMESPACE.match(namespace) else ""


def document(report: Report) -> dict[str, Any]:
    rendered: dict[str, list[dict[str, Any]]] = {}
    for result in report.results:
        entries = rendered.setdefault(_namespace_of(result), [])
        entries.extend(_entry(report, result, o) for o in report.outcomes(result))
    # a fleet's entries were rendered as it was judged (``keep``): its results are not kept
    by_namespace: dict[str, list[dict[str, Any]] | Entries] = {**(report.kept.groups if report.kept else rendered)}
    cluster_entries = by_namespace.pop("", [])
    problems = [
        {
            "source": TOOL, "policy": TOOL, "rule": "read-manifest", "result": "error", "scored": True,
            "message": problem.text(), "timestamp": _timestamp(report),
            "properties": {"file": problem.source, "document": str(problem.index), "line": str(problem.line)},
        }
        for problem in report.problems
    ]
    if isinstance(cluster_entries, Entries):  # (a report is rendered once: they join the kept entries)
        for entry in problems:
            cluster_entries.add(json_line(entry), "error")
    else:
        cluster_entries.extend(problems)
    items = [report_object(WGPOLICY, namespace, REPORT_NAME, entries, MANAGED_BY)
             for namespace, entries in sorted(by_namespace.items())]  # fmt: skip
    if cluster_entries:
        items.append(report_object(WGPOLICY, None, REPORT_NAME, cluster_entries, MANAGED_BY))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def report_object(kinds: ReportKinds, namespace: str | None, name: str, results: list[dict[str, Any]] | Entries,
                  labels: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One report: a namespace's (``namespace``), or the cluster's (None), with its summary; ``results``
    rendered already (``Entries``: a fleet's audit) or not."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace is not None:
        metadata["namespace"] = namespace
    counts = results.statuses if isinstance(results, Entries) else Counter(r["result"] for r in results)
    report: dict[str, Any] = {"apiVersion": kinds.api_version, "kind": kinds.namespaced if namespace else kinds.cluster,
                              "metadata": metadata}  # fmt: skip
    if kinds.report_source:
        report["source"] = TOOL
    report["summary"] = {status: counts[status] for status in _STATUSES}
    report["results"] = results
    return report


def resource_of(result: Result) -> dict[str, Any]:
    """The object reference a result names: apiVersion, kind, name, namespace, and uid when it has one."""
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
    return resource


def result_entry(outcome: Outcome, resource: dict[str, Any], timestamp: int,
                 properties: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One policy rule's result on one resource, as a report's ``results[]`` item."""
    return {
        "source": TOOL,
        "policy": outcome.policy,
        "rule": outcome.rule,
        "category": "GPU",
        "severity": _SEVERITY.get(outcome.mode, "info"),
        "result": outcome.status,
        "scored": True,
        "message": outcome.message,
        "timestamp": {"seconds": timestamp, "nanos": 0},
        "resources": [resource],
        "properties": properties,
    }


def _entry(report: Report, result: Result, outcome: Outcome) -> dict[str, Any]:
    doc = result.document
    properties = {"mode": outcome.mode, "phase": outcome.phase, "file": doc.source, "document": str(doc.index)}
    return result_entry(outcome, resource_of(result), report.timestamp, properties)


def _timestamp(report: Report) -> dict[str, int]:
    return {"seconds": report.timestamp, "nanos": 0}

"""What ``gpu-admission report`` keeps of each namespace until its report is written: compactly.

A fleet has hundreds of thousands of workloads; a report result is a dict of
a dozen fields. The ledger keeps, per object, its reference and one tuple per
rule outcome (the strings shared with the engine's: policy, rule, mode and
most messages are the same objects across workloads), and builds the
reports' dicts one namespace at a time, as they are written. Objects that
no rule applies to (every outcome ``skip``: no GPU, and every policy
GPU-only) are not kept: as Kyverno reports no resource its rules do not
match, they would only bury the findings.

A namespace's results go into one report, ``gpu-admission``; past
``budget`` bytes of results (etcd keeps objects below 1.5 MiB) into
``gpu-admission-2``, ``-3`` …, an object's results never split.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from webhook.audit.judge import Outcome, Phase, Result, Status
from webhook.audit.report import policyreport
from webhook.audit.report.policyreport import ReportKinds

NAME = "gpu-admission"
#: every report the command writes carries these labels; by them it finds the ones it no longer writes, to empty them
LABELS = {**policyreport.MANAGED_BY, "gpu-admission.io/report": "cluster"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())
#: how many results a report holds, in its metadata: a run reads only the metadata of the reports it finds
RESULTS = "gpu-admission.io/results"
BUDGET = 1_000_000

#: (policy, rule, status, mode, message, phase): an Outcome, as a tuple
_Compact = tuple[str, str, Status, str, str, Phase]


class Ledger:
    """Each namespace's objects and their rule outcomes ("" for cluster-scoped objects)."""

    def __init__(self) -> None:
        self._by_namespace: dict[str, list[tuple[dict[str, Any], tuple[_Compact, ...]]]] = {}
        self.objects = 0  # kept
        self.skipped = 0  # no rule applies

    def add(self, result: Result, outcomes: Iterable[Outcome]) -> None:
        kept = tuple((o.policy, o.rule, o.status, o.mode, o.message, o.phase) for o in outcomes)
        if all(o[2] == "skip" for o in kept):
            self.skipped += 1
            return
        resource = policyreport.resource_of(result)
        self._by_namespace.setdefault(result.request.namespace if resource.get("namespace") else "", []).append(
            (resource, kept))
        self.objects += 1

    def namespaces(self) -> list[str]:
        return sorted(self._by_namespace)

    def reports(self, namespace: str, kinds: ReportKinds, timestamp: int, budget: int = BUDGET) -> Iterator[dict[str, Any]]:
        """The namespace's reports (its records dropped as they are built)."""
        records = self._by_namespace.pop(namespace, [])
        chunk: list[dict[str, Any]] = []
        size = 0
        number = 1
        for resource, kept in records:
            entries = [_entry(compact, resource, timestamp) for compact in kept]
            weight = sum(len(orjson.dumps(e)) for e in entries)
            if chunk and size + weight > budget:
                yield _report(kinds, namespace, number, chunk)
                chunk, size, number = [], 0, number + 1
            chunk.extend(entries)
            size += weight
        if chunk:
            yield _report(kinds, namespace, number, chunk)


    @staticmethod
    def emptied(meta: dict[str, Any], kinds: ReportKinds) -> dict[str, Any]:
        """A report of ours no longer written (its metadata), with its results gone."""
        namespace, name = meta.get("namespace") or None, str(meta.get("name"))
        return _annotated(policyreport.report_object(kinds, namespace, name, [], LABELS))


def report_name(number: int) -> str:
    return NAME if number == 1 else f"{NAME}-{number}"


def _report(kinds: ReportKinds, namespace: str, number: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    return _annotated(policyreport.report_object(kinds, namespace or None, report_name(number), results, LABELS))


def _annotated(report: dict[str, Any]) -> dict[str, Any]:
    report["metadata"]["annotations"] = {RESULTS: str(len(report["results"]))}
    return report


def _entry(compact: _Compact, resource: dict[str, Any], timestamp: int) -> dict[str, Any]:
    policy, rule, status, mode, message, phase = compact
    return policyreport.result_entry(Outcome(policy, rule, status, mode, message, phase), resource, timestamp,
                                     {"mode": mode, "phase": phase})  # fmt: skip

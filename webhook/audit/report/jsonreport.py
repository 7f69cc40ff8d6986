"""``-o json``: the report as one JSON document, schema version 1.

The schema is docs/audit-report.schema.json; fields are only ever added
within a version, so readers can rely on what is there. Each result and
error is written on one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from webhook.audit.judge import Result
from webhook.audit.report.run import Kept, Report, json_chunks, json_line

VERSION = 1


def render(report: Report) -> str:
    return "".join(chunks(report))


def chunks(report: Report) -> Iterator[str]:
    """``render``'s text in pieces, to write as they come."""
    yield from json_chunks(document(report), expand=2)
    yield "\n"


def keep(report: Report, result: Result, kept: Kept) -> None:
    """One result's line of ``results`` (``Report.keep``)."""
    kept.put(json_line(_result(result)))


def document(report: Report) -> dict[str, Any]:
    verdicts = report.verdicts
    return {
        "kind": "AuditReport",
        "version": VERSION,
        "summary": {
            "objects": report.objects,
            "denied": verdicts["deny"],
            "warned": verdicts["warn"],
            "mutated": verdicts["mutate"],
            "passed": verdicts["pass"],
            "errors": len(report.problems),
            "ignored": report.ignored,
            "failOn": report.fail_on,
            "exitCode": report.exit_code,
        },
        "results": report.kept.entries() if report.kept is not None else [_result(r) for r in report.results],
        "errors": [
            {"source": p.source, "document": p.index, "line": p.line, "message": p.message} for p in report.problems
        ],
    }


def _result(result: Result) -> dict[str, Any]:
    doc, request = result.document, result.request
    return {
        "source": doc.source,
        "document": doc.index,
        "line": doc.line,
        "item": doc.item,
        "apiVersion": str(doc.obj.get("apiVersion", "")),
        "kind": request.kind,
        "namespace": request.namespace,
        "name": request.display_name,
        "verdict": result.verdict,
        "allowed": not result.denied,
        "findings": [
            {"phase": phase, "policy": f.policy, "rule": f.rule, "mode": f.label, "message": f.message, "field": f.field}
            for phase, findings in (("mutate", result.mutation.findings), ("validate", result.validation.findings))
            for f in findings
        ],
        "changes": [{"policy": policy, "rule": rule, "what": what} for policy, rule, what in result.mutation.changes],
        "warnings": list(result.warnings),
        "patch": list(result.mutation.patch),
    }

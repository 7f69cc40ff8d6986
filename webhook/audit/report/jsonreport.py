"""``-o json``: the report as one JSON document, schema version 1.

The schema is docs/audit-report.schema.json; fields are only ever added
within a version, so readers can rely on what is there. Each result and
error is written on one line.
"""

from __future__ import annotations

from typing import Any

from webhook.audit.judge import Result
from webhook.audit.report.run import Report, dump_json

VERSION = 1


def render(report: Report) -> str:
    return dump_json(document(report), expand=2) + "\n"


def document(report: Report) -> dict[str, Any]:
    verdicts = report.verdicts
    return {
        "kind": "AuditReport",
        "version": VERSION,
        "summary": {
            "objects": len(report.results),
            "denied": verdicts["deny"],
            "warned": verdicts["warn"],
            "mutated": verdicts["mutate"],
            "passed": verdicts["pass"],
            "errors": len(report.problems),
            "ignored": report.ignored,
            "failOn": report.fail_on,
            "exitCode": report.exit_code,
        },
        "results": [_result(r) for r in report.results],
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
        "changes": [{"policy": c.policy, "rule": c.rule, "what": c.what} for c in result.mutation.changes],
        "warnings": list(result.warnings),
        "patch": list(result.mutation.patch),
    }

"""``-o sarif``: SARIF 2.1.0 for code-scanning UIs (GitHub, GitLab, Azure DevOps).

One reporting rule per policy rule (``policy/rule``) plus one for documents
that cannot be read; one result per finding, ``error`` for enforce,
``warning`` for warn and ``note`` for audit, located at the file and the
line where the object's document starts (a logical location names the
object when there is no file: stdin, the live cluster).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from webhook import __version__
from webhook.audit.inputs import CLUSTER_PREFIX, STDIN_NAME, Document
from webhook.audit.judge import Result
from webhook.audit.report.run import TOOL, Entries, Kept, Report, json_chunks, json_line
from webhook.policy import engine

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INVALID_MANIFEST = f"{TOOL}/invalid-manifest"
_LEVEL = {"enforce": "error", "warn": "warning", "audit": "note"}


def render(report: Report) -> str:
    return "".join(chunks(report))


def chunks(report: Report) -> Iterator[str]:
    """``render``'s text in pieces, to write as they come."""
    yield from json_chunks(document(report), expand=4)
    yield "\n"


def keep(report: Report, result: Result, kept: Kept) -> None:
    """One result's findings, a line each (``Report.keep``)."""
    index = kept.once.get("sarif-index")
    if index is None:
        index = kept.once["sarif-index"] = _index(report)
    entries = kept.group("")
    for finding in _findings(index, result):
        entries.add(json_line(finding), "")


def _text(subject: str, message: str) -> str:
    """The finding's message, naming the object once: most messages start with it ("Pod ml/x container ...")."""
    return message if message.startswith(f"{subject} ") or message.startswith(f"{subject}:") else f"{subject}: {message}"


def _index(report: Report) -> dict[str, int]:
    """Each reporting rule's position in the driver's rules."""
    return {rule["id"]: position for position, rule in enumerate(_rules(report))}


def _findings(index: dict[str, int], result: Result) -> Iterator[dict[str, Any]]:
    for finding in result.findings:
        rule_id = f"{finding.policy}/{finding.rule}"
        yield {
            "ruleId": rule_id,
            **({"ruleIndex": index[rule_id]} if rule_id in index else {}),
            "level": _LEVEL.get(finding.mode, "note"),
            "message": {"text": _text(result.request.subject, finding.message)},
            "locations": [_location(result.document, result.request.subject)],
        }


def document(report: Report) -> dict[str, Any]:
    rules = _rules(report)
    index = {rule["id"]: position for position, rule in enumerate(rules)}
    results: list[dict[str, Any]] = [found for result in report.results for found in _findings(index, result)]
    problems: list[dict[str, Any]] = []
    for problem in report.problems:
        problems.append({
            "ruleId": INVALID_MANIFEST,
            "ruleIndex": index[INVALID_MANIFEST],
            "level": "error",
            "message": {"text": problem.text()},
            "locations": [{"physicalLocation": _physical(problem.source, problem.line)}]
            if problem.source != STDIN_NAME else [],
        })
    listed: list[dict[str, Any]] | Entries = results + problems
    if report.kept is not None:  # a fleet's findings were rendered as it was judged (``keep``)
        listed = report.kept.group("")
        for found in problems:  # (a report is rendered once: they join the kept lines)
            listed.add(json_line(found), "")
    driver = {"name": TOOL, "version": __version__, "rules": rules}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{"tool": {"driver": driver}, "results": listed}]}


def _rules(report: Report) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for policy in report.policies.active_policies:
        for rule in engine.RULES:
            cfg = getattr(policy.spec.rules, rule.name)
            if cfg is None or cfg.mode == "off":
                continue
            rules.append({
                "id": f"{policy.metadata.name}/{rule.name}",
                "name": rule.name,
                "shortDescription": {"text": f"{rule.name} of policy {policy.metadata.name}"},
                "defaultConfiguration": {"level": _LEVEL.get(cfg.mode, "note")},
                "properties": {"mode": cfg.mode, "policy": policy.metadata.name},
            })
    rules.append({
        "id": INVALID_MANIFEST, "name": "invalidManifest",
        "shortDescription": {"text": "a document that is not valid YAML/JSON or not a Kubernetes object"},
        "defaultConfiguration": {"level": "error"},
    })
    return rules


def _location(doc: Document, subject: str) -> dict[str, Any]:
    location: dict[str, Any] = {"logicalLocations": [{"fullyQualifiedName": subject, "kind": "resource"}]}
    if doc.source != STDIN_NAME and not doc.source.startswith(CLUSTER_PREFIX):
        location["physicalLocation"] = _physical(doc.source, doc.line)
    return location


def _physical(source: str, line: int) -> dict[str, Any]:
    path = Path(source)
    uri = path.as_uri() if path.is_absolute() else quote(path.as_posix())
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if line:
        physical["region"] = {"startLine": line}
    return physical

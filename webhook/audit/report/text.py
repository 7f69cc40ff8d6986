"""The readable report: one block per object, then the findings per rule and the totals.

Colour only when the caller says so (a terminal, and ``NO_COLOR`` unset).
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.audit.judge import Result
from webhook.audit.report.run import Report

_COLOURS = {"DENY": "31", "WARN": "33", "MUTATE": "36", "PASS": "32", "ERROR": "35"}
_INDENT = " " * 8


def render(report: Report) -> str:
    paint = _painter(report.colour)
    lines: list[str] = []
    for result in report.results:
        lines.extend(_block(result, paint))
    for problem in report.problems:
        lines.append(f"{paint('ERROR')}   {problem.text()}")
    counts = report.rule_counts()
    if counts:
        width = max(len(rule) for rule in counts)
        lines.append("")
        lines.append("findings per rule:")
        for rule, by_mode in counts.items():
            modes = "  ".join(f"{mode} {by_mode[mode]}" for mode in ("enforce", "warn", "audit", "note") if by_mode[mode])
            lines.append(f"  {rule:{width}}  {modes}")
    lines.append(_totals(report))
    return "\n".join(lines) + "\n"


def _block(result: Result, paint: Callable[[str], str]) -> list[str]:
    status = result.verdict.upper()
    doc = result.document
    where = f"{doc.source}, document {doc.index}" + (f", line {doc.line}" if doc.line else "")
    if doc.item is not None:
        where += f", items[{doc.item}]"
    lines = [f"{paint(status)}{' ' * (8 - len(status))}{result.request.subject}  ({where})"]
    changes = list(dict.fromkeys(c.what for c in result.mutation.changes))
    if changes:
        lines.append(f"{_INDENT}would set: {', '.join(changes)}")
    lines.extend(f"{_INDENT}{f.label:7} {f.text()}" for f in result.findings)
    return lines


def _totals(report: Report) -> str:
    verdicts = report.verdicts
    parts = [
        f"{_plural(len(report.results), 'object')}: {verdicts['deny']} denied, {verdicts['warn']} warned, "
        f"{verdicts['mutate']} mutated, {verdicts['pass']} passed"
    ]
    if report.problems:
        parts.append(f"{_plural(len(report.problems), 'document')} could not be audited")
    if report.ignored:
        parts.append(f"{_plural(report.ignored, 'object')} of kinds the policies do not cover")
    return "; ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _painter(colour: bool) -> Callable[[str], str]:
    def paint(status: str) -> str:
        code = _COLOURS.get(status)
        return f"\033[{code}m{status}\033[0m" if colour and code else status

    return paint

"""The readable report: one block per object, then the findings per rule and the totals.

Colour only when the caller says so (a terminal, and ``NO_COLOR`` unset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from webhook.audit.judge import Result
from webhook.audit.report.run import Kept, Report

_COLOURS = {"DENY": "31", "WARN": "33", "MUTATE": "36", "PASS": "32", "ERROR": "35"}
_INDENT = " " * 8


def render(report: Report) -> str:
    return "".join(chunks(report))


def chunks(report: Report) -> Iterator[str]:
    """``render``'s text in pieces, to write as they come: a line each."""
    if report.kept is not None:
        yield from (f"{entry}\n" for entry in report.kept.entries())
    else:
        paint = _painter(report.colour)
        yield from (f"{line}\n" for result in report.results for line in _block(result, paint))
    yield from (f"{line}\n" for line in _tail(report))


def keep(report: Report, result: Result, kept: Kept) -> None:
    """One result's block of lines (``Report.keep``)."""
    kept.put("\n".join(_block(result, _painter(report.colour))))


def _tail(report: Report) -> list[str]:
    """The problems, the findings per rule, the totals."""
    paint = _painter(report.colour)
    lines: list[str] = []
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
    return lines


def _block(result: Result, paint: Callable[[str], str]) -> list[str]:
    status = result.verdict.upper()
    doc = result.document
    where = f"{doc.source}, document {doc.index}" + (f", line {doc.line}" if doc.line else "")
    if doc.item is not None:
        where += f", items[{doc.item}]"
    lines = [f"{paint(status)}{' ' * (8 - len(status))}{result.request.subject}  ({where})"]
    changes = list(dict.fromkeys(what for _, _, what in result.mutation.changes))
    if changes:
        lines.append(f"{_INDENT}would set: {', '.join(changes)}")
    lines.extend(f"{_INDENT}{f.label:7} {f.text()}" for f in result.findings)
    return lines


def _totals(report: Report) -> str:
    verdicts = report.verdicts
    parts = [
        f"{_plural(report.objects, 'object')}: {verdicts['deny']} denied, {verdicts['warn']} warned, "
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

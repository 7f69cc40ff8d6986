"""``gpu-admission test``'s readable output: a results table per test, as ``kyverno test`` prints it,
then what each failed check found (the messages searched, the fields that differ)."""

from __future__ import annotations

from collections.abc import Sequence

from webhook.audit.suite.checks import Check
from webhook.audit.suite.testrun import TestRun

_HEADER = ("ID", "POLICY", "RULE", "RESOURCE", "RESULT", "REASON")


def render(runs: Sequence[TestRun], *, fail_only: bool = False) -> str:
    lines: list[str] = []
    for run in runs:
        document = run.document
        judged = sum(1 for _, seen in run.objects if seen is not None)
        lines.append(f"Loading test {document.path} ({document.test.metadata.name}) ...")
        lines.append(f"  Applying {_plural(len(run.policies.policies), 'policy', 'policies')} to "
                     f"{_plural(judged, 'resource')} ...")  # fmt: skip
        shown = [(n, c) for n, c in enumerate(run.checks, start=1) if not (fail_only and c.passed)]
        if shown:
            lines.extend(_table([_row(n, c) for n, c in shown]))
        for number, failed in ((n, c) for n, c in shown if not c.passed):
            lines.append(f"  #{number} {failed.resource}{f' [{failed.rule}]' if failed.rule else ''}: {failed.reason}")
            lines.extend(f"      {detail}" for detail in failed.details)
        lines.append("")
    checks = [c for run in runs for c in run.checks]
    failed_count = sum(1 for c in checks if not c.passed)
    lines.append(f"Test Summary: {_plural(len(checks) - failed_count, 'test')} passed and "
                 f"{_plural(failed_count, 'test')} failed")  # fmt: skip
    return "\n".join(lines) + "\n"


def _row(number: int, check: Check) -> tuple[str, ...]:
    policy, _, rule = check.rule.partition("/")
    return (str(number), policy or "-", rule or "-", check.resource, "Pass" if check.passed else "Fail", check.reason)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [_HEADER, *rows]) for i in range(len(_HEADER))]
    rule = "│" + "│".join("─" * (w + 2) for w in widths) + "│"

    def line(cells: tuple[str, ...]) -> str:
        return "│" + "│".join(f" {c:{w}} " for c, w in zip(cells, widths)) + "│"

    return [rule, line(_HEADER), rule, *(line(r) for r in rows), rule]


def _plural(count: int, noun: str, plural: str = "") -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"

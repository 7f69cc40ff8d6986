"""The report formats of ``gpu-admission audit -o FORMAT``: one module each.

Every renderer takes a :class:`~webhook.audit.report.run.Report` and returns
the text to print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO

from webhook.audit.judge import Result
from webhook.audit.report import jsonreport, junit, policyreport, sarif, text
from webhook.audit.report.run import Kept, Report

Renderer = Callable[[Report], str]

FORMATS: dict[str, Renderer] = {
    "text": text.render,
    "json": jsonreport.render,
    "policyreport": policyreport.render,
    "junit": junit.render,
    "sarif": sarif.render,
}
#: per format (every one): how a result is rendered as it is judged (``Report.keep``, a fleet's audit), and
#: the report's text in pieces
KEEP: dict[str, Callable[[Report, Result, Kept], None]] = {
    "text": text.keep, "json": jsonreport.keep, "policyreport": policyreport.keep, "junit": junit.keep,
    "sarif": sarif.keep,
}
_CHUNKS: dict[str, Callable[[Report], Iterator[str]]] = {
    "text": text.chunks, "json": jsonreport.chunks, "policyreport": policyreport.chunks, "junit": junit.chunks,
    "sarif": sarif.chunks,
}


def write(report: Report, output: str, out: IO[str]) -> None:
    """The report in format ``output`` on ``out``, a piece at a time (never whole in memory)."""
    for chunk in _CHUNKS[output](report):
        out.write(chunk)


__all__ = ["KEEP", "FORMATS", "Kept", "Renderer", "Report", "write"]

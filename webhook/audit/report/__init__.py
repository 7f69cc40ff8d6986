"""The report formats of ``gpu-admission audit -o FORMAT``: one module each.

Every renderer takes a :class:`~webhook.audit.report.run.Report` and returns
the text to print.
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.audit.report import jsonreport, junit, policyreport, sarif, text
from webhook.audit.report.run import Report

Renderer = Callable[[Report], str]

FORMATS: dict[str, Renderer] = {
    "text": text.render,
    "json": jsonreport.render,
    "policyreport": policyreport.render,
    "junit": junit.render,
    "sarif": sarif.render,
}
#: the formats that break results down per policy rule (``Report.outcomes``)
BY_RULE = frozenset({"policyreport", "junit"})

__all__ = ["BY_RULE", "FORMATS", "Renderer", "Report"]

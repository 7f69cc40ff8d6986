"""``-o junit``: one test case per object and policy rule, for CI test-report views.

A test suite per input file (or the cluster); a case named ``policy/rule``
with the object as its class name. An enforce finding is a ``<failure
type="deny">``; a warning is a ``<failure type="warn">`` when warnings fail
the run (``--fail-on warn``) and otherwise a passing case whose
``<system-out>`` carries it, tagged with a ``result`` property either way,
so the two stay apart; audit-mode findings are reported like warnings
that never fail. A document that cannot be read is an ``<error>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator

from webhook.audit.judge import Outcome, Result
from webhook.audit.report.run import TOOL, Report


def render(report: Report) -> str:
    suites = ET.Element("testsuites", name=TOOL)
    by_source: dict[str, ET.Element] = {}
    for result in report.results:
        suite = _suite(suites, by_source, result.document.source)
        for outcome in report.outcomes(result):
            _case(suite, report, result, outcome)
    for problem in report.problems:
        suite = _suite(suites, by_source, problem.source)
        case = ET.SubElement(suite, "testcase", name=f"document {problem.index}", classname=problem.source)
        ET.SubElement(case, "error", type="invalid-manifest", message=problem.message).text = problem.text()
    for suite in [suites, *by_source.values()]:
        _count(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _suite(root: ET.Element, suites: dict[str, ET.Element], source: str) -> ET.Element:
    if source not in suites:
        suites[source] = ET.SubElement(root, "testsuite", name=source)
    return suites[source]


def _case(suite: ET.Element, report: Report, result: Result, outcome: Outcome) -> None:
    doc = result.document
    case = ET.SubElement(
        suite, "testcase", name=outcome.rule_id, classname=result.request.subject,
        file=doc.source, line=str(doc.line),
    )  # fmt: skip
    props = ET.SubElement(case, "properties")
    ET.SubElement(props, "property", name="result", value=outcome.status)
    ET.SubElement(props, "property", name="mode", value=outcome.mode)
    if outcome.status == "skip":
        ET.SubElement(case, "skipped", message=outcome.message)
    elif outcome.status == "fail" and outcome.mode == "enforce":
        ET.SubElement(case, "failure", type="deny", message=outcome.message).text = outcome.message
    elif outcome.status == "warn" and report.fail_on == "warn":
        ET.SubElement(case, "failure", type="warn", message=outcome.message).text = outcome.message
    elif outcome.status in ("warn", "fail"):
        ET.SubElement(case, "system-out").text = f"{outcome.mode}: {outcome.message}"


def _count(element: ET.Element) -> None:
    cases = list(_cases(element))
    element.set("tests", str(len(cases)))
    for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))


def _cases(element: ET.Element) -> Iterator[ET.Element]:
    return element.iter("testcase")

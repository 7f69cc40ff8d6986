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

from webhook.audit.inputs import Problem
from webhook.audit.judge import Outcome, Result
from webhook.audit.report.run import TOOL, Kept, Report

#: a test case's child that makes it count as failed, in error or skipped, and the suite's attribute counting it
_COUNTED = (("failure", "failures"), ("error", "errors"), ("skipped", "skipped"))


def render(report: Report) -> str:
    return "".join(chunks(report))


#: the characters of a report written at once
_PIECE = 64 * 1024


def chunks(report: Report) -> Iterator[str]:
    """``render``'s text in pieces, to write as they come: a test case each when results were kept
    (``keep``), as ``ET.indent`` and ``ET.tostring`` would write the whole tree."""
    if report.kept is None:
        # in pieces all the same: one write of it all, cut short by a reader gone (`| head`), would not
        # raise BrokenPipeError (the buffered writer keeps the part it wrote), and the exit would be 0
        whole = _whole(report)
        for start in range(0, len(whole), _PIECE):
            yield whole[start:start + _PIECE]
        return
    for problem in report.problems:  # (a report is rendered once: they join the kept cases)
        case = _problem(problem)
        ET.indent(case, level=2)
        report.kept.group(problem.source).add(ET.tostring(case, encoding="unicode"), "tests")
        report.kept.group(problem.source).statuses["errors"] += 1
    groups = report.kept.groups
    if not groups:
        yield _whole(report)
        return
    counted = ("tests", *(attr for _, attr in _COUNTED))
    total = {attr: str(sum(e.statuses[attr] for e in groups.values())) for attr in counted}
    yield _opening(ET.Element("testsuites", {"name": TOOL, **total}), declaration=True)
    for source, entries in groups.items():
        suite = ET.Element("testsuite", {"name": source, **{attr: str(entries.statuses[attr]) for attr in counted}})
        if not entries:
            yield "\n  " + ET.tostring(suite, encoding="unicode")
            continue
        yield "\n  " + _opening(suite)
        for line in entries:
            yield "\n    " + line
        yield "\n  </testsuite>"
    yield "\n</testsuites>\n"


def _opening(element: ET.Element, declaration: bool = False) -> str:
    """An element's opening tag (and the XML declaration before it), as ``ET.tostring`` writes it."""
    empty = ET.tostring(element, encoding="unicode", xml_declaration=declaration)
    return empty.removesuffix(" />") + ">"


def keep(report: Report, result: Result, kept: Kept) -> None:
    """One result's test cases, a policy rule each, in its source's suite (``Report.keep``)."""
    entries = kept.group(result.document.source)
    for outcome in report.outcomes(result):
        case = _case(report, result, outcome)
        ET.indent(case, level=2)
        entries.add(ET.tostring(case, encoding="unicode"), "tests")
        for tag, attr in _COUNTED:
            if case.find(tag) is not None:
                entries.statuses[attr] += 1


def _whole(report: Report) -> str:
    suites = ET.Element("testsuites", name=TOOL)
    by_source: dict[str, ET.Element] = {}
    for result in report.results:
        suite = _suite(suites, by_source, result.document.source)
        for outcome in report.outcomes(result):
            suite.append(_case(report, result, outcome))
    for problem in report.problems:
        _suite(suites, by_source, problem.source).append(_problem(problem))
    for suite in [suites, *by_source.values()]:
        _count(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _problem(problem: Problem) -> ET.Element:
    case = ET.Element("testcase", name=f"document {problem.index}", classname=problem.source)
    ET.SubElement(case, "error", type="invalid-manifest", message=problem.message).text = problem.text()
    return case


def _suite(root: ET.Element, suites: dict[str, ET.Element], source: str) -> ET.Element:
    if source not in suites:
        suites[source] = ET.SubElement(root, "testsuite", name=source)
    return suites[source]


def _case(report: Report, result: Result, outcome: Outcome) -> ET.Element:
    doc = result.document
    case = ET.Element(
        "testcase", name=outcome.rule_id, classname=result.request.subject, file=doc.source, line=str(doc.line),
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
    return case


def _count(element: ET.Element) -> None:
    cases = list(_cases(element))
    element.set("tests", str(len(cases)))
    for tag, attr in _COUNTED:
        element.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))


def _cases(element: ET.Element) -> Iterator[ET.Element]:
    return element.iter("testcase")

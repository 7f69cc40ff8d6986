"""``gpu-admission test -o junit``: one test suite per GPUAdmissionTest, one case per check.

A check that did not hold is a ``<failure>`` whose text carries what it
found (messages searched, fields that differ); a test file that could not be
run is an ``<error>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from webhook.audit.suite.testrun import TestRun

NAME = "gpu-admission test"


def render(runs: Sequence[TestRun], broken: Sequence[str] = ()) -> str:
    root = ET.Element("testsuites", name=NAME)
    for run in runs:
        document = run.document
        suite = ET.SubElement(root, "testsuite", name=document.test.metadata.name, file=str(document.path))
        for number, check in enumerate(run.checks, start=1):
            name = f"#{number} {check.resource}" + (f" {check.rule}" if check.rule else "")
            case = ET.SubElement(suite, "testcase", classname=document.test.metadata.name, name=name,
                                 file=str(document.path))  # fmt: skip
            if not check.passed:
                ET.SubElement(case, "failure", type="mismatch", message=check.reason).text = "\n".join(
                    [check.reason, *check.details])
    if broken:
        suite = ET.SubElement(root, "testsuite", name="broken test files")
        for problem in broken:
            case = ET.SubElement(suite, "testcase", classname="broken test files", name=problem.split(": ")[0])
            ET.SubElement(case, "error", type="invalid-test", message=problem).text = problem
    for element in [root, *root.iter("testsuite")]:
        cases = list(element.iter("testcase"))
        element.set("tests", str(len(cases)))
        element.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        element.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"

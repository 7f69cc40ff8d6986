"""One expectation of a test, held against what the engine answered for one object."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.audit.suite import difference
from webhook.audit.suite.observed import Observed
from webhook.audit.suite.schema import Expectation
from webhook.errors import SuiteError
from webhook.policy import yaml_errors


@dataclass(frozen=True)
class Check:
    """One row of the results table: an expectation on one resource, passed or not, and why."""

    test: str  # the test's name
    row: int  # the expectation's index in spec.results
    resource: str  # the object, "Pod ml/trainer"
    rule: str  # "policy/rule", or "" for the object as a whole
    want: str  # the verdict expected ("" when only a message or a patched resource is)
    got: str  # the verdict found
    reasons: tuple[str, ...]  # what did not hold; none when it passed
    details: tuple[str, ...] = ()  # the messages searched, the fields that differ

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons) if self.reasons else f"ok: {self.got}"


def check(test: str, row: int, expectation: Expectation, observed: Observed, folder: Path) -> Check:
    """``expectation`` on the object ``observed`` (patched resources are read relative to ``folder``)."""
    if expectation.policy is not None and expectation.rule is not None:
        got, messages = observed.rule(expectation.policy, expectation.rule)
    else:
        got, messages = observed.verdict, observed.messages
    reasons: list[str] = []
    details: list[str] = []
    if expectation.verdict is not None and expectation.verdict != got:
        reasons.append(f"want {expectation.verdict}, got {got}")
    if expectation.message is not None and not any(re.search(expectation.message, m) for m in messages):
        reasons.append(f"no message matches /{expectation.message}/")
        details.extend(f"message: {m}" for m in messages or ["(none)"])
    if expectation.patchedResource is not None:
        path = folder / expectation.patchedResource
        found = difference.differences(read_object(path, test), observed.result.patched)
        if found:
            reasons.append(f"patched resource differs from {expectation.patchedResource}")
            details.extend(found)
    subject = observed.result.request.subject
    return Check(test, row, subject, expectation.rule_id, expectation.verdict or "", got, tuple(reasons), tuple(details))


def read_object(path: Path, test: str) -> Any:
    """The one object a patched-resource file holds; SuiteError when there is none."""
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError([f"{test}: patchedResource {path}: cannot read: {exc} (--update writes it)"]) from exc
    except yaml_errors.UNREADABLE as exc:
        raise SuiteError([f"{test}: patchedResource {path}: {yaml_errors.describe(exc)}"]) from exc
    if not isinstance(value, dict) or not value.get("kind"):
        raise SuiteError([f"{test}: patchedResource {path}: not a Kubernetes object"])
    return value

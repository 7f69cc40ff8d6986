"""What one audit run found, as every report format reads it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import orjson

from webhook.audit.inputs import Problem
from webhook.audit.judge import Outcome, Plan, Result, outcomes
from webhook.policy.loader import PolicySet
from webhook.view.protocol import ClusterView

TOOL = "gpu-admission"


@dataclass
class Report:
    """The results of one run, the documents that could not be audited, and how to judge them."""

    policies: PolicySet
    view: ClusterView
    results: list[Result] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: objects read that are no workload kind the policies cover
    ignored: int = 0
    #: "warn": warnings fail the run too
    fail_on: str = "deny"
    #: whether the text report may use colour
    colour: bool = False
    #: seconds since the epoch, stamped on PolicyReport results
    timestamp: int = 0
    _plans: dict[tuple[str, str, str], Plan] = field(default_factory=dict, repr=False, compare=False)

    def failed(self, result: Result) -> bool:
        return result.denied or (self.fail_on == "warn" and result.warned)

    @property
    def exit_code(self) -> int:
        """1 when any object fails (or a document could not be read), else 0."""
        return 1 if self.problems or any(self.failed(r) for r in self.results) else 0

    def outcomes(self, result: Result) -> Iterator[Outcome]:
        return outcomes(self.policies, self.view, result, self._plans)

    @cached_property
    def verdicts(self) -> Counter[str]:
        return Counter(r.verdict for r in self.results)

    def rule_counts(self) -> dict[str, Counter[str]]:
        """policy/rule → findings per label (the mode, or "note"), in the order rules were first seen."""
        counts: dict[str, Counter[str]] = {}
        for result in self.results:
            for finding in result.findings:
                counts.setdefault(f"{finding.policy}/{finding.rule}", Counter())[finding.label] += 1
        return counts


def dump_json(value: object, expand: int, _depth: int = 0) -> str:
    """JSON with objects and arrays indented down to ``expand`` levels, and each deeper value on one line.

    A fleet-sized report has hundreds of thousands of small objects: indenting
    them all triples the output, while one line per result stays readable and
    greppable and is written by orjson in C, as the server writes its patches.
    """
    if _depth >= expand or not isinstance(value, (dict, list)) or not value:
        return _line(value)
    inner = "  " * (_depth + 1)
    if isinstance(value, dict):
        parts = [f"{inner}{_line(k)}: {dump_json(v, expand, _depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(parts) + "\n" + "  " * _depth + "}"
    parts = [inner + dump_json(v, expand, _depth + 1) for v in value]
    return "[\n" + ",\n".join(parts) + "\n" + "  " * _depth + "]"


def _line(value: object) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        # what orjson refuses and a manifest can hold: an integer past 64 bits, bytes (!!binary)
        return json.dumps(value, separators=(",", ":"), default=str)

"""What one audit run found, as every report format reads it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from webhook.audit.inputs import Problem
from webhook.audit.judge import Outcome, Plan, Result, outcomes
from webhook.audit.packed import Packed
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
    #: a fleet's results as its format renders them, kept instead of ``results`` (``keep``)
    kept: Kept | None = None
    _plans: dict[tuple[str, str, str], Plan] = field(default_factory=dict, repr=False, compare=False)

    def failed(self, result: Result) -> bool:
        return result.denied or (self.fail_on == "warn" and result.warned)

    def keep(self, result: Result, render: Callable[[Report, Result, Kept], None]) -> None:
        """Counts ``result`` and keeps what ``render`` puts in ``kept`` of it (``Kept.put``) instead of it."""
        if self.kept is None:
            raise ValueError("keep: no kept entries to add to (Report.kept)")
        self.kept.objects += 1
        self.kept.verdicts[result.verdict] += 1
        self.kept.failed = self.kept.failed or self.failed(result)
        _count_findings(self.kept.rule_counts, result)
        render(self, result, self.kept)

    @property
    def objects(self) -> int:
        """How many objects were judged."""
        return self.kept.objects if self.kept is not None else len(self.results)

    @property
    def exit_code(self) -> int:
        """1 when any object fails (or a document could not be read), else 0."""
        if self.problems:
            return 1
        failed = self.kept.failed if self.kept is not None else any(self.failed(r) for r in self.results)
        return 1 if failed else 0

    def outcomes(self, result: Result) -> Iterator[Outcome]:
        return outcomes(self.policies, self.view, result, self._plans)

    @cached_property
    def verdicts(self) -> Counter[str]:
        if self.kept is not None:
            return self.kept.verdicts
        return Counter(r.verdict for r in self.results)

    def rule_counts(self) -> dict[str, Counter[str]]:
        """policy/rule → findings per label (the mode, or "note"), in the order rules were first seen."""
        if self.kept is not None:
            return self.kept.rule_counts
        counts: dict[str, Counter[str]] = {}
        for result in self.results:
            _count_findings(counts, result)
        return counts


def _count_findings(counts: dict[str, Counter[str]], result: Result) -> None:
    for finding in result.findings:
        counts.setdefault(f"{finding.policy}/{finding.rule}", Counter())[finding.label] += 1


class Raw(str):
    """Text already rendered as JSON: written as it is by ``dump_json``."""


class Entries:
    """Rendered entries of one group, in order, compressed (:class:`~webhook.audit.packed.Packed`), with
    how many of each status they hold; iterating yields them as :class:`Raw` text."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self._packed = Packed()

    def add(self, entry: str, status: str) -> None:
        self._packed.add(entry.encode("utf-8", "surrogatepass"))
        if status:
            self.statuses[status] += 1

    def __len__(self) -> int:
        return len(self._packed)

    def __iter__(self) -> Iterator[Raw]:
        for entry in self._packed:
            yield Raw(entry.decode("utf-8", "surrogatepass"))


@dataclass
class Kept:
    """A fleet's results as their report renders them (``Report.keep``), without the results.

    The report's summary comes first and counts every result, so the entries wait until
    the last one is judged, compressed: tens of MB for 100,000 results instead of hundreds
    as objects. Entries go in groups (a PolicyReport's namespace; "" for the others).
    """

    objects: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    failed: bool = False
    rule_counts: dict[str, Counter[str]] = field(default_factory=dict)
    groups: dict[str, Entries] = field(default_factory=dict)
    #: what a format works out once per run (SARIF's rule index)
    once: dict[str, Any] = field(default_factory=dict)

    def put(self, entry: str, group: str = "", status: str = "") -> None:
        """One rendered entry in ``group``, counted under ``status`` if there is one."""
        self.group(group).add(entry, status)

    def group(self, name: str) -> Entries:
        """The entries of group ``name``, made (empty) if there are none yet: groups keep their order."""
        entries = self.groups.get(name)
        if entries is None:
            entries = self.groups[name] = Entries()
        return entries

    def entries(self, group: str = "") -> Entries:
        return self.groups.get(group) or Entries()


def dump_json(value: object, expand: int) -> str:
    """JSON with objects and arrays indented down to ``expand`` levels, and each deeper value on one line.

    A fleet-sized report has hundreds of thousands of small objects: indenting
    them all triples the output, while one line per result stays readable and
    greppable and is written by orjson in C, as the server writes its patches.
    """
    return "".join(json_chunks(value, expand))


def json_chunks(value: object, expand: int, _depth: int = 0) -> Iterator[str]:
    """``dump_json``'s text in pieces, to write as they come (:class:`Entries` are lists of :class:`Raw`)."""
    if isinstance(value, Entries) and not value:
        yield "[]"
        return
    if _depth >= expand or not isinstance(value, (dict, list, Entries)) or not value:
        yield json_line(value)
        return
    inner = "  " * (_depth + 1)
    if isinstance(value, dict):
        yield "{\n"
        for n, (k, v) in enumerate(value.items()):
            yield (",\n" if n else "") + f"{inner}{json_line(k)}: "
            yield from json_chunks(v, expand, _depth + 1)
        yield "\n" + "  " * _depth + "}"
        return
    yield "[\n"
    for n, v in enumerate(value):
        yield f",\n{inner}" if n else inner
        yield from json_chunks(v, expand, _depth + 1)
    yield "\n" + "  " * _depth + "]"


def json_line(value: object) -> str:
    """One value as JSON on one line."""
    if isinstance(value, Raw):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        # what orjson refuses and a manifest can hold: an integer past 64 bits, bytes (!!binary)
        return json.dumps(value, separators=(",", ":"), default=str)

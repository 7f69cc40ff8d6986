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
    #: the results as the format renders them, when they are not kept (``keep``: a fleet's audit)
    kept: Kept | None = None
    _plans: dict[tuple[str, str, str], Plan] = field(default_factory=dict, repr=False, compare=False)

    def failed(self, result: Result) -> bool:
        return result.denied or (self.fail_on == "warn" and result.warned)

    def keep(self, result: Result, entry: str) -> None:
        """Counts ``result`` and keeps its rendered ``entry`` in ``kept`` instead of the result itself."""
        if self.kept is None:
            raise ValueError("keep: no kept entries to add to (Report.kept)")
        self.kept.add(entry, result.verdict, self.failed(result))
        _count_findings(self.kept.rule_counts, result)

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


@dataclass
class Kept:
    """A fleet's results as their report renders them, one entry (text) each, without the results.

    The report's summary comes first and counts every result, so the entries wait until
    the last one is judged, compressed (:class:`~webhook.audit.packed.Packed`): tens of MB
    for 100,000 results instead of hundreds as objects. Iterating yields them in order, as
    :class:`Raw` text.
    """

    objects: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    failed: bool = False
    rule_counts: dict[str, Counter[str]] = field(default_factory=dict)
    _entries: Packed = field(default_factory=Packed, repr=False)

    def add(self, entry: str, verdict: str, failed: bool) -> None:
        self.objects += 1
        self.verdicts[verdict] += 1
        self.failed = self.failed or failed
        self._entries.add(entry.encode("utf-8", "surrogatepass"))

    def __len__(self) -> int:
        return self.objects

    def __iter__(self) -> Iterator[Raw]:
        for entry in self._entries:
            yield Raw(entry.decode("utf-8", "surrogatepass"))


def dump_json(value: object, expand: int) -> str:
    """JSON with objects and arrays indented down to ``expand`` levels, and each deeper value on one line.

    A fleet-sized report has hundreds of thousands of small objects: indenting
    them all triples the output, while one line per result stays readable and
    greppable and is written by orjson in C, as the server writes its patches.
    """
    return "".join(json_chunks(value, expand))


def json_chunks(value: object, expand: int, _depth: int = 0) -> Iterator[str]:
    """``dump_json``'s text in pieces, to write as they come (:class:`Kept` entries are lists of :class:`Raw`)."""
    if isinstance(value, Kept) and not value:
        yield "[]"
        return
    if _depth >= expand or not isinstance(value, (dict, list, Kept)) or not value:
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

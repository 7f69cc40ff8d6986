"""One GPUAdmissionTest run: its policies, cluster facts and resources through the audit's engine path.

Each resource goes through :func:`webhook.audit.judge.judge` (mutate, then
validate the mutated object, as kube-apiserver calls the two webhooks) and
its rules' outcomes through :func:`webhook.audit.judge.outcomes`, exactly as
``gpu-admission audit`` reports them; then every expectation is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.audit import inputs, snapshot
from webhook.audit.inputs import Document, Problem
from webhook.audit.judge import Plan, judge, outcomes
from webhook.audit.suite.checks import Check, check
from webhook.audit.suite.files import TestDocument
from webhook.audit.suite.observed import Observed
from webhook.errors import ManifestError, PolicyError, SuiteError
from webhook.policy import loader, schema
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

#: (kind, namespace, name) of an object, as a test names it
Key = tuple[str, str, str]


@dataclass
class TestRun:
    """What one test found: every object judged, and every expectation checked."""

    __test__ = False  # not a pytest class

    document: TestDocument
    policies: loader.PolicySet
    #: every object read, with what the engine answered (None: a kind no policy covers)
    objects: list[tuple[Key, Observed | None]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def find(self, reference: str) -> list[tuple[Key, Observed | None]]:
        """The objects a reference names: ``Kind/namespace/name``, ``Kind/name`` or ``name``."""
        parts = reference.split("/")
        return [(key, seen) for key, seen in self.objects if _named(key, parts)]


def _named(key: Key, parts: list[str]) -> bool:
    kind, namespace, name = key
    if len(parts) == 1:
        return parts[0] == name
    if len(parts) == 2:
        return (parts[0], parts[1]) == (kind, name)
    return len(parts) == 3 and (parts[0], parts[1], parts[2]) == key


PolicyCache = dict[tuple[Path, ...], loader.PolicySet]


def execute(document: TestDocument, cache: PolicyCache, *, checking: bool = True) -> TestRun:
    """Run one test (``checking=False``: judge only, for --update); SuiteError when it cannot run."""
    spec, label = document.test.spec, document.label
    policies = _policies(document, cache)
    run = TestRun(document, policies)
    objects = _read(document, spec.resources, "spec.resources")
    try:
        view = snapshot.load([document.folder / p for p in spec.clusterState], spec.complete)
    except ManifestError as exc:
        raise SuiteError([f"{label}: spec.clusterState: {exc}"]) from exc
    view = _with_namespaces(view.with_objects(d.obj for d in objects), spec.request.namespaceLabels)
    stored = _read(document, spec.request.oldResources, "spec.request.oldResources")
    old = {_key(d.obj, spec.request.namespace): d.obj for d in stored}
    plans: dict[tuple[str, str, str], Plan] = {}
    for doc in objects:
        key = _key(doc.obj, spec.request.namespace)
        if spec.request.operation == "UPDATE" and key not in old:
            raise SuiteError([f"{label}: spec.request.oldResources: no old object for {'/'.join(key)}"])
        result = judge(policies, view, doc, spec.request.namespace, old=old.get(key))
        seen = None if result is None else Observed(result, tuple(outcomes(policies, view, result, plans)))
        run.objects.append((key, seen))
    if checking:
        run.checks.extend(_checks(run))
    return run


def _checks(run: TestRun) -> Iterator[Check]:
    document = run.document
    _known_names(document, run.policies)
    for row, expectation in enumerate(document.test.spec.results):
        for position, reference in enumerate(expectation.resources):
            where = f"{document.label}: spec.results[{row}].resources[{position}]: {reference}"
            found = run.find(reference)
            if not found:
                raise SuiteError([f"{where}: no such object among the resources"])
            if len(found) > 1:
                raise SuiteError([f"{where}: names {len(found)} objects: write Kind/namespace/name"])
            observed = found[0][1]
            if observed is None:
                raise SuiteError([f"{where}: not judged: its kind is no workload kind the policies know"])
            yield check(document.test.metadata.name, row, expectation, observed, document.folder)


def _known_names(document: TestDocument, policies: loader.PolicySet) -> None:
    """SuiteError naming every expectation whose policy is not in the test's policies, or whose rule is
    no rule: a misspelt name would find no result, which a "none" verdict expects, and pass unchecked."""
    names = [p.metadata.name for p in policies.policies]
    rules = list(schema.Rules.model_fields)
    problems = []
    for row, expectation in enumerate(document.test.spec.results):
        where = f"{document.label}: spec.results[{row}]"
        if expectation.policy is not None and expectation.policy not in names:
            problems.append(f"{where}.policy: {expectation.policy}: no such policy in spec.policies "
                            f"({', '.join(sorted(names)) or 'none'})")
        if expectation.rule is not None and expectation.rule not in rules:
            problems.append(f"{where}.rule: {expectation.rule}: no such rule ({', '.join(rules)})")
    if problems:
        raise SuiteError(problems)


def _policies(document: TestDocument, cache: PolicyCache) -> loader.PolicySet:
    files: list[Path] = []
    for entry in document.test.spec.policies:
        path = document.folder / entry
        if path.is_dir():
            files.extend(loader.policy_files(path))
        elif path.is_file():
            files.append(path)
        else:
            raise SuiteError([f"{document.label}: spec.policies: {entry}: no such file or folder"])
    key = tuple(p.resolve() for p in files)
    if key not in cache:
        try:
            cache[key] = loader.load_files(files)
        except PolicyError as exc:
            raise SuiteError([f"{document.label}: spec.policies: {problem}" for problem in exc.problems]) from exc
    return cache[key]


def _read(document: TestDocument, paths: list[str], field_name: str) -> list[Document]:
    """The objects of the manifests ``paths``; SuiteError for a path or a document that cannot be read."""
    try:
        files = inputs.find_files(str(document.folder / p) for p in paths)
        read = list(inputs.stream(files))
    except ManifestError as exc:
        raise SuiteError([f"{document.label}: {field_name}: {exc}"]) from exc
    problems = [f"{document.label}: {field_name}: {p.text()}" for p in read if isinstance(p, Problem)]
    if problems:
        raise SuiteError(problems)
    return [d for d in read if isinstance(d, Document)]


def _key(obj: dict[str, Any], namespace: str | None) -> Key:
    request = Request.for_object(obj, namespace=None if (obj.get("metadata") or {}).get("namespace") else namespace)
    return request.kind, request.namespace, request.display_name


def _with_namespaces(view: SnapshotView, labels: dict[str, dict[str, str]]) -> SnapshotView:
    """The view with these namespaces (and their labels) in place of any of the same name."""
    if not labels:
        return view
    kept = [o for o in view.objects_by_kind.get("Namespace", ()) if (o.get("metadata") or {}).get("name") not in labels]
    added = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(values)}}
             for name, values in labels.items()]  # fmt: skip
    return dataclasses.replace(
        view, objects_by_kind={**view.objects_by_kind, "Namespace": (*kept, *added)}, known=view.known | {"namespaces"}
    )

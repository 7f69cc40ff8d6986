"""``gpu-admission audit``: the same policies and engine over manifests, offline.

Manifests come from files, folders (recursively) or stdin (``-``), several
documents per file, ``List`` kinds flattened (so Helm and kustomize output
work). A document that is not valid YAML is reported and skipped; the
others are still audited. Cluster facts come from ``--cluster-state`` files
(``kubectl get nodes,namespaces,pods,resourcequotas,priorityclasses,runtimeclasses
-A -o yaml``, or API ``NodeList``/``PodList`` responses). Each object is
mutated as the mutating webhook would, then validated, as kube-apiserver
would call the two webhooks.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import ManifestError
from webhook.policy import engine, loader
from webhook.policy.decision import Decision, Finding
from webhook.policy.dra import is_claim
from webhook.policy.request import Request
from webhook.policy.view import RESOURCES, SnapshotView, flatten_lists

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Result:
    source: str
    subject: str
    mutation: Decision
    validation: Decision

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.mutation.findings + self.validation.findings

    @property
    def denied(self) -> bool:
        return not (self.mutation.allowed and self.validation.allowed)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("audit", help="evaluate policies on manifests, offline")
    p.add_argument("paths", nargs="+", help="files or folders of manifests, or - for stdin")
    p.add_argument("--policies", type=Path, default=Path("policies"))
    p.add_argument("--cluster-state", action="append", default=[], type=Path,
                   help="YAML/JSON of nodes, namespaces, pods, quotas, classes (repeatable)")
    p.add_argument("--complete", action="append", default=[], choices=RESOURCES, metavar="RESOURCE",
                   help="treat RESOURCE (e.g. pods) as fully listed by the cluster-state files even "
                        "when they hold none of it (repeatable)")
    p.add_argument("--namespace", help="namespace for objects that name none (default: default)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policies = loader.load_directory(args.policies)
    view = load_cluster_state(args.cluster_state, complete=args.complete)
    problems: list[str] = []
    manifests = list(read_manifests(args.paths, problems))
    # DRA: a pod and the ResourceClaimTemplate it names often come in one stream
    view = view.with_objects(obj for _, obj in manifests)
    results = [
        result
        for source, obj in manifests
        if (result := audit_object(policies, view, source, obj, namespace=args.namespace)) is not None
    ]
    sys.stdout.write(render_json(results) if args.format == "json" else render_text(results))
    for problem in problems:
        print(f"skipped: {problem}", file=sys.stderr)
    return 1 if problems or any(r.denied for r in results) else 0


def load_cluster_state(files: Iterable[Path], complete: Iterable[str] = ()) -> SnapshotView:
    """A snapshot of the objects in ``files``; a broken file is an error, not a gap."""
    documents: list[Any] = []
    for file in files:
        problems: list[str] = []
        documents.extend(parse_documents(str(file), file.read_text(encoding="utf-8"), problems))
        if problems:
            raise ManifestError(problems[0])
    return SnapshotView.from_objects(documents, known=complete)


def audit_object(
    policies: loader.PolicySet, view: SnapshotView, source: str, obj: Mapping[str, Any], namespace: str | None = None
) -> Result | None:
    """Mutate then validate one object; None when it has no pod spec we know."""
    request = Request.for_object(obj, namespace=namespace)
    if (request.group, request.kind) not in policies.kinds and not is_claim(request.group, request.kind):
        return None
    mutation = engine.evaluate(policies, request, view, "mutate")
    patched = mutation.patched if mutation.patched is not None else obj
    validation = engine.evaluate(policies, Request.for_object(patched, namespace=namespace), view, "validate")
    return Result(source, request.subject, mutation, validation)


def read_manifests(paths: Iterable[str], problems: list[str]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Objects of every manifest; documents that do not parse go to ``problems``."""
    for raw in paths:
        if raw == "-":
            yield from _objects("<stdin>", sys.stdin.read(), problems)
            continue
        path = Path(raw)
        if not path.exists():
            raise ManifestError(f"{path}: no such file or folder")
        files = sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES) if path.is_dir() else [path]
        for file in files:
            yield from _objects(str(file), file.read_text(encoding="utf-8"), problems)


def _objects(source: str, text: str, problems: list[str]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for doc in parse_documents(source, text, problems):
        for obj in flatten_lists([doc] if isinstance(doc, Mapping) else []):
            yield source, obj


_SEPARATOR = re.compile(r"^---(?=\s|$)", re.M)


def parse_documents(source: str, text: str, problems: list[str]) -> list[Any]:
    """Every YAML document of ``text``; when one is broken, the others still parse.

    PyYAML stops at the first error, so a broken stream is split at its
    ``---`` separators and each document parsed on its own.
    """
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        pass
    documents: list[Any] = []
    chunks = [c for c in _SEPARATOR.split(text) if c.strip()]
    for index, chunk in enumerate(chunks, start=1):
        try:
            documents.extend(yaml.safe_load_all(chunk))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1} of the document" if mark is not None else ""
            problems.append(f"{source}: document {index}: invalid YAML{where}: {getattr(exc, 'problem', None) or exc}")
    return documents


def render_text(results: list[Result]) -> str:
    lines = []
    for r in results:
        changes = sorted({c.what for c in r.mutation.changes})
        status = "DENY" if r.denied else ("MUTATE" if changes else "PASS")
        lines.append(f"{status:7} {r.subject}  ({r.source})")
        if changes:
            lines.append(f"        would set: {', '.join(changes)}")
        lines.extend(f"        {f.mode:7} {f.text()}" for f in r.findings)
    denied = sum(r.denied for r in results)
    lines.append(f"{len(results)} objects, {denied} denied")
    return "\n".join(lines) + "\n"


def render_json(results: list[Result]) -> str:
    return json.dumps(
        [
            {
                "source": r.source,
                "subject": r.subject,
                "denied": r.denied,
                "patch": list(r.mutation.patch),
                "findings": [f.__dict__ for f in r.findings],
            }
            for r in results
        ],
        indent=2,
    ) + "\n"

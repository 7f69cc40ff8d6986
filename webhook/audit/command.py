"""``gpu-admission audit``: its options, and one run from inputs to report and exit code.

Exit codes: 0 nothing denied; 1 at least one object denied (or warned,
with ``--fail-on warn``), a document that could not be read, or the
cluster could not be listed; 2 usage error, a missing input or an invalid
policy; 3 an unexpected error (one line; ``--debug`` prints the traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from webhook import collector
from webhook.audit import connection, crash, inputs, mutated, snapshot
from webhook.audit.inputs import Document, Problem
from webhook.audit.judge import judge
from webhook.audit.progress import Progress
from webhook.audit.report import FORMATS, KEEP, Kept, Report, write
from webhook.errors import ClusterError, ManifestError, PolicyError
from webhook.policy import loader
from webhook.registry import flags
from webhook.registry.resolver import ResolverSettings
from webhook.view.protocol import RESOURCES, ClusterView
from webhook.view.snapshot import SnapshotView

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_UNEXPECTED = 0, 1, 2, 3


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "audit", help="evaluate the policies on manifests or on what runs in a cluster, offline",
        description="Mutate then validate every object as the two webhooks would, and report.",
    )  # fmt: skip
    p.add_argument("paths", nargs="*", metavar="PATH", help="manifest files or folders (recursive), or - for stdin")
    p.add_argument("--policies", type=Path, default=Path("policies"), help="policy folder (default: policies)")
    p.add_argument("--namespace", help="namespace for objects that name none (default: default)")
    _cluster_options(p.add_argument_group("cluster facts"))
    _output_options(p.add_argument_group("output"))
    flags.add_arguments(p, "every unknown image of the manifests, before the audit")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    p.set_defaults(func=run)
    return p


def _cluster_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--cluster-state", action="append", default=[], type=Path, metavar="FILE|DIR",
                   help="kubectl get … -o json|yaml dumps or API lists of nodes, namespaces, pods, quotas, "
                        "priority and runtime classes (repeatable)")
    g.add_argument("--complete", action="append", default=[], choices=RESOURCES, metavar="RESOURCE",
                   help="treat RESOURCE (e.g. pods) as fully listed by the cluster-state files even "
                        "when they hold none of it (repeatable)")
    g.add_argument("--cluster", action="store_true",
                   help="read the live cluster; without PATHs, audit the workloads of opted-in namespaces")
    connection.add_connection_arguments(g)
    g.add_argument("--quota-namespace",
                   help="with --cluster: where the GPU quota ledgers are (default: serve's --quota-namespace default)")


def _output_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("-o", "--output", "--format", dest="output", choices=list(FORMATS), default="text",
                   metavar="FORMAT", help=f"report format: {', '.join(FORMATS)} (default: text)")
    g.add_argument("--fail-on", choices=["deny", "warn"], default="deny",
                   help="exit 1 on denials (default) or on warnings too")
    g.add_argument("--diff", action="store_true",
                   help="print the unified diff of each object the mutating webhook would change instead of a report")
    g.add_argument("--write-mutated", type=Path, metavar="DIR",
                   help="write the mutated manifests below DIR, one file per input file")


def run(args: argparse.Namespace) -> int:
    """One audit; expected failures become one line on stderr and an exit code."""
    return crash.guarded(lambda: audit(args, sys.stdin, sys.stdout, sys.stderr), args.debug,
                         {ManifestError: EXIT_USAGE, ClusterError: EXIT_FOUND})  # fmt: skip


def audit(args: argparse.Namespace, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> int:
    _check_usage(args)
    with collector.fewer_collections():
        return _audit(args, stdin, stdout, stderr)


def _audit(args: argparse.Namespace, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> int:
    policies = loader.load_enforcing(args.policies)
    notes: list[str] = []
    progress = Progress(stderr, 0, enabled=stderr.isatty())
    view, documents = _sources(args, policies, stdin, notes, progress)
    if isinstance(view, SnapshotView) and args.paths:
        # DRA: a pod and the ResourceClaimTemplate it names often come in one stream
        items = list(documents)
        view = view.with_objects(d.obj for d in items if isinstance(d, Document))
        documents = iter(items)
    resolving = flags.settings(args, budget=60.0)
    if resolving is not None:
        documents, view = _resolve_images(documents, view, resolving)
    report = Report(
        policies, view, fail_on=args.fail_on, timestamp=int(time.time()),
        colour=stdout.isatty() and not os.environ.get("NO_COLOR"),
    )  # fmt: skip
    files: dict[str, list[mutated.Entry]] = {}
    # a fleet's running workloads, judged as they come: each result is kept as its report renders it
    # (compressed text, a few bytes to a few hundred an object), not whole (whole pods and their mutated
    # copies were GBs for 100,000 pods)
    keep = KEEP[args.output] if _fleet(args) else None
    if keep is not None:
        report.kept = Kept()
    try:
        for item in documents:
            if isinstance(item, Problem):
                report.problems.append(item)
                if args.write_mutated:
                    files.setdefault(item.relative, []).append(item)
                continue
            result = judge(policies, view, item, namespace=args.namespace)
            if result is None:
                report.ignored += 1
            elif keep is not None:
                report.keep(result, keep)
            else:
                report.results.append(result)
            if args.write_mutated:
                files.setdefault(item.relative, []).append((item, result))
            progress.object_done()
    finally:
        progress.close()
    if args.write_mutated:
        mutated.check_targets(args.write_mutated, files)  # (before the report: refused, nothing is written)
    _emit(args, report, stdout, stderr, notes)
    if args.write_mutated:
        mutated.write(args.write_mutated, files)
    return report.exit_code


def _fleet(args: argparse.Namespace) -> bool:
    """Audits the cluster's running workloads, for a report that names them (no --diff, --write-mutated,
    which read whole results)."""
    return bool(args.cluster and not args.paths and not args.diff and not args.write_mutated)


def _check_usage(args: argparse.Namespace) -> None:
    if not args.paths and not args.cluster:
        raise ManifestError("nothing to audit: give manifest PATHs, - for stdin, or --cluster")
    if args.diff and args.output != "text":
        raise ManifestError(f"--diff prints a diff instead of a report: it takes no -o {args.output} (run them apart)")
    if args.cluster and args.cluster_state:
        raise ManifestError("--cluster and --cluster-state are alternatives: use one")
    if args.page_size < 1:
        raise ManifestError("--page-size must be at least 1")


def _sources(
    args: argparse.Namespace, policies: loader.PolicySet, stdin: IO[str], notes: list[str], progress: Progress
) -> tuple[ClusterView, Iterator[Document | Problem]]:
    """The view, and the documents to audit."""
    if args.cluster:
        from webhook.audit import cluster_source
        from webhook.ledger.settings import LedgerSettings

        api_client = cluster_source.connect(args.kubeconfig, args.context, args.in_cluster)
        cluster = cluster_source.fetch(
            # (pods kept packed as they are listed, rather than listed again)
            api_client, args.page_size, all_namespaces=args.all_namespaces, keep_pods=not args.paths,
            ledger_namespace=args.quota_namespace or LedgerSettings.namespace,
        )
        notes.extend(cluster.notes)
        if not args.paths:
            return cluster.view, cluster_source.workloads(cluster, policies, notes, args.page_size)
        view: ClusterView = cluster.view
    else:
        view = snapshot.load(args.cluster_state, args.complete)
    files = inputs.find_files(args.paths)
    progress.total = len(files)
    return view, inputs.stream(files, stdin, progress.file_done)


def _resolve_images(
    documents: Iterator[Document | Problem], view: ClusterView, settings: ResolverSettings
) -> tuple[Iterator[Document | Problem], ClusterView]:
    """--resolve-images: every unknown image of the documents is read from its registry first."""
    items = list(documents)
    configs = flags.resolve_all((d.obj for d in items if isinstance(d, Document)), settings)
    if isinstance(view, SnapshotView):
        view = dataclasses.replace(view, image_configs={**view.image_configs, **configs})
    return iter(items), view


def _emit(args: argparse.Namespace, report: Report, stdout: IO[str], stderr: IO[str], notes: list[str]) -> None:
    if args.diff:
        stdout.write(mutated.diff(report.results))
        for line in _failures(report):
            print(line, file=stderr)  # a diff alone does not say why the run fails
    else:
        write(report, args.output, stdout)
    if args.diff or args.output != "text":
        # the report carries them too; CI logs show stderr
        for problem in report.problems:
            print(f"could not audit: {problem.text()}", file=stderr)
    for note in notes:
        print(f"note: {note}", file=stderr)


def _failures(report: Report) -> Iterator[str]:
    """Why each failing object fails: its denials (or, warned with ``--fail-on warn``, its warnings), a line each."""
    for result in report.results:
        if not report.failed(result):
            continue
        doc = result.document
        where = f"{doc.source}, document {doc.index}" + (f", line {doc.line}" if doc.line else "")
        mode, verdict = ("enforce", "denied") if result.denied else ("warn", "warned")
        for finding in result.findings:
            if finding.mode == mode and not finding.note:
                yield f"{verdict}: {result.request.subject} ({where}): {finding.text()}"

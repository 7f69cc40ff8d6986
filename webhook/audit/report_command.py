"""``gpu-admission report``: what runs in the cluster, judged by the policies, kept as PolicyReports in the cluster.

The workloads of the namespaces the webhooks reach (or all, ``-A``) are read
as ``audit --cluster`` reads them (every list paginated, pods listed once for
the view and once more, page by page, to judge them, so that no list is held
whole) and judged as if created now. Each namespace then gets one
``wgpolicyk8s.io/v1alpha2`` PolicyReport (``--api openreports``: an
``openreports.io/v1alpha1`` Report) named ``gpu-admission``, written by
server-side apply under the field manager ``gpu-admission-report``; the
results of objects gone or fixed leave with the next write, and the reports
of namespaces with nothing left to report are emptied (no ``delete`` verb is
needed: a report goes with its namespace).

Exit codes: 0 the reports are written (whatever they say: they are the
output); 1 the cluster could not be read or a report not written
(each named on stderr); 2 usage or an invalid policy; 3 an unexpected error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from webhook import collector
from webhook.audit import cluster_source, connection, crash
from webhook.audit.judge import Plan, judge, outcomes
from webhook.audit.ledger import RESULTS, SELECTOR, Ledger
from webhook.audit.report.policyreport import OPENREPORTS, WGPOLICY, ReportKinds
from webhook.errors import ClusterError
from webhook.policy import loader

EXIT_OK, EXIT_FAILED = 0, 1
APIS = {"wgpolicyk8s": WGPOLICY, "openreports": OPENREPORTS}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report", help="judge what runs in the cluster and keep PolicyReports of it there (server-side apply)",
        description="Write a PolicyReport per namespace of what the policies say of its running workloads.",
    )  # fmt: skip
    p.add_argument("--policies", type=Path, default=Path("policies"), help="policy folder (default: policies)")
    p.add_argument("--api", choices=list(APIS), default="wgpolicyk8s",
                   help="wgpolicyk8s: wgpolicyk8s.io/v1alpha2 PolicyReports (default); "
                        "openreports: openreports.io/v1alpha1 Reports")  # fmt: skip
    connection.add_connection_arguments(p)
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    with collector.fewer_collections():
        return crash.guarded(lambda: report(args, sys.stdout, sys.stderr), args.debug, {ClusterError: EXIT_FAILED})


def report(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    """Judge, then write every namespace's report and empty the stale ones; failures name what they hit."""
    if args.page_size < 1:
        raise ClusterError("--page-size must be at least 1")
    policies = loader.load_enforcing(args.policies)
    kinds = APIS[args.api]
    api_client = cluster_source.connect(args.kubeconfig, args.context, args.in_cluster)
    writer = _Writer(api_client, kinds)
    try:
        ledger, notes = _judge(api_client, policies, args)
        writer.write(ledger)
        writer.empty_stale()
    finally:
        api_client.close()
    for note in notes:
        print(f"note: {note}", file=stderr)
    for failure in writer.failures:
        print(f"error: {failure}", file=stderr)
    results = ", ".join(f"{status} {writer.counts[status]}" for status in ("pass", "fail", "warn", "error", "skip"))
    print(f"{len(writer.written)} {kinds.namespaced}(s) written ({ledger.objects} objects; {results}), "
          f"{writer.emptied} emptied; {ledger.skipped} objects no rule applies to", file=stdout)  # fmt: skip
    return EXIT_FAILED if writer.failures else EXIT_OK


class _Writer:
    """Writes reports one at a time, remembering what it wrote and what it could not."""

    def __init__(self, api_client: Any, kinds: ReportKinds) -> None:
        from webhook.cluster.custom_objects import CustomResource

        group, _, version = kinds.api_version.partition("/")
        self.api_client, self.kinds = api_client, kinds
        self.namespaced = CustomResource(group, version, kinds.plural, kinds.namespaced, True)
        self.cluster = CustomResource(group, version, kinds.cluster_plural, kinds.cluster, False)
        self.written: set[tuple[str | None, str]] = set()
        self.failures: list[str] = []
        self.counts: Counter[str] = Counter()
        self.emptied = 0

    def write(self, ledger: Ledger) -> None:
        timestamp = int(time.time())
        for namespace in ledger.namespaces():
            for obj in ledger.reports(namespace, self.kinds, timestamp):
                if self._apply(self.namespaced if namespace else self.cluster, obj):
                    self.written.add((namespace or None, obj["metadata"]["name"]))
                    self.counts.update(obj["summary"])

    def empty_stale(self) -> None:
        """Our reports not written this run (their namespace has nothing left to report) lose their results."""
        from webhook.cluster import custom_objects

        for resource in (self.namespaced, self.cluster):
            try:
                stale = [meta for meta in custom_objects.metadata(self.api_client, resource, SELECTOR)
                         if (meta.get("namespace") or None, meta.get("name")) not in self.written
                         and (meta.get("annotations") or {}).get(RESULTS) != "0"]  # fmt: skip
            except ClusterError as exc:
                self.failures.append(str(exc))
                continue
            for meta in stale:
                self.emptied += self._apply(resource, Ledger.emptied(meta, self.kinds))

    def _apply(self, resource: Any, obj: dict[str, Any]) -> bool:
        from webhook.cluster import custom_objects

        try:
            custom_objects.apply(self.api_client, resource, obj)
        except ClusterError as exc:
            self.failures.append(str(exc))
            return False
        return True


def _judge(api_client: Any, policies: loader.PolicySet, args: argparse.Namespace) -> tuple[Ledger, list[str]]:
    cluster = cluster_source.fetch(api_client, args.page_size, all_namespaces=args.all_namespaces)
    ledger, notes = Ledger(), list(cluster.notes)  # (what the listing could not read, as audit says it)
    plans: dict[tuple[str, str, str], Plan] = {}
    for document in cluster_source.workloads(cluster, policies, notes, args.page_size):
        result = judge(policies, cluster.view, document)
        if result is not None:
            ledger.add(result, outcomes(policies, cluster.view, result, plans))
    return ledger, notes



"""``gpu-admission test PATH…``: run GPUAdmissionTest files and compare what the engine answers with what they expect.

Exit codes: 0 every expectation holds (or ``--update`` wrote them); 1 one
does not; 2 a test file is broken (unreadable, an unknown field, a policy,
resource or file it names that cannot be read; each problem with its file,
document and field), or a usage error; 3 an unexpected error.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from webhook import collector
from webhook.audit import crash
from webhook.audit.suite import files, junit, table, update
from webhook.audit.suite.testrun import PolicyCache, TestRun, execute
from webhook.errors import SuiteError

EXIT_OK, EXIT_FAILED, EXIT_BROKEN = 0, 1, 2


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "test", help="run policy tests (GPUAdmissionTest files): expected verdicts, messages and patched resources",
        description="Run every GPUAdmissionTest under the paths through the engine and compare the results.",
    )  # fmt: skip
    p.add_argument("paths", nargs="+", metavar="PATH", help="test files, or folders searched recursively")
    p.add_argument("--file-name", default=files.FILE_PATTERN, metavar="PATTERN",
                   help=f"test file names searched in folders (default: {files.FILE_PATTERN})")
    p.add_argument("-o", "--output", choices=["table", "junit"], default="table", help="table (default) or junit")
    p.add_argument("--fail-only", action="store_true", help="the table shows only the checks that failed")
    p.add_argument("--update", action="store_true",
                   help="write today's results into the tests' expectations (and patched resources) for review")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    with collector.fewer_collections():
        return crash.guarded(lambda: test(args, sys.stdout, sys.stderr), args.debug, {})


def test(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    """Run the tests; the report on ``stdout``, broken test files on ``stderr``."""
    broken: list[str] = []
    runs: list[TestRun] = []
    try:
        paths = files.find(args.paths, args.file_name)
    except SuiteError as exc:
        broken.extend(exc.problems)
        paths = []
    cache: PolicyCache = {}
    for path in paths:
        try:
            documents = files.load(path)
        except SuiteError as exc:
            broken.extend(exc.problems)
            continue
        for document in documents:
            try:
                runs.append(execute(document, cache, checking=not args.update))
            except SuiteError as exc:
                broken.extend(exc.problems)
    if args.update:
        try:
            for line in update.update(runs):
                print(line, file=stdout)
        except SuiteError as exc:
            broken.extend(exc.problems)
    elif args.output == "junit":
        stdout.write(junit.render(runs, broken))
    else:
        stdout.write(table.render(runs, fail_only=args.fail_only))
    for problem in broken:
        print(f"broken test: {problem}", file=stderr)
    if broken:
        return EXIT_BROKEN
    return EXIT_FAILED if any(run.failed for run in runs) else EXIT_OK

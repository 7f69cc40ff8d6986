"""``gpu-admission policies compile``: policy files → ValidatingAdmissionPolicies and
MutatingAdmissionPolicies, the coverage table, and ``--check`` for CI.

Exit codes: 0 compiled (or, with ``--check``, the output is up to date); 1
``--check`` found the output stale; 2 usage error or invalid policy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, Any

from webhook.cel import mutating, output, reach, validating
from webhook.cel.validating import Compilation
from webhook.errors import PolicyError
from webhook.policy import loader, offload

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compile", help="compile what needs no cluster state to ValidatingAdmissionPolicy and MutatingAdmissionPolicy",
        description="Emit kube-apiserver's in-process CEL policies for every rule part that reads only the object, "
                    "its old object, the request and its namespace's labels; print what compiled and what the webhook keeps.",
    )
    p.add_argument("--policies", type=Path, default=Path("policies"), help="policy folder (default: policies)")
    p.add_argument("--kube-version", default="1.36", type=_version, metavar="1.X",
                   help="the oldest Kubernetes version to run on (default 1.36; before 1.36 no MutatingAdmissionPolicy)")
    p.add_argument("-o", "--output", type=Path, help="folder to write (kustomize-ready); default: the manifests on stdout")
    p.add_argument("--webhooks", type=Path, default=Path("deploy/base"),
                   help="folder of the webhook configurations whose reach the policies take (default: deploy/base)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the output folder is not what compiling gives")
    p.add_argument("--quiet", action="store_true", help="no coverage table")
    p.set_defaults(func=run)
    return p


def _version(text: str) -> tuple[int, int]:
    try:
        return offload.kube_version(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.check and args.output is None:
        print("--check needs -o/--output: the folder to compare", file=sys.stderr)
        return EXIT_USAGE
    try:
        policies = loader.load_enforcing(args.policies)
        mutating_reach, validating_reach = reach.read(args.webhooks)
    except PolicyError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    files = compile_files(policies, args.kube_version, mutating_reach, validating_reach)
    table = sys.stderr if args.output is None else sys.stdout
    if not args.quiet:
        print_table(Compilation.of(policies, args.kube_version).rows, table)
    if args.check:
        found = output.stale(args.output, files)
        for name in found:
            print(f"{args.output / name}: stale: run `gpu-admission policies compile --policies {args.policies} "
                  f"--kube-version {args.kube_version[0]}.{args.kube_version[1]} -o {args.output}`", file=sys.stderr)
        return EXIT_STALE if found else EXIT_OK
    if args.output is None:
        for name in (output.VALIDATING, output.MUTATING):
            if name in files:
                sys.stdout.write(files[name])
        return EXIT_OK
    output.write(args.output, files)
    print(f"wrote {', '.join(sorted(files))} to {args.output}", file=table)
    return EXIT_OK


def compile_files(policies: loader.PolicySet, version: tuple[int, int], mutating_reach: reach.Reach,
                  validating_reach: reach.Reach) -> dict[str, str]:
    """File name → content of the compiled output."""
    compilation = Compilation.of(policies, version)
    validating_docs = validating.documents(compilation, validating_reach)
    mutating_docs = mutating.documents(compilation, mutating_reach) if version >= offload.MUTATING_POLICIES_GA else []
    return output.render(validating_docs, mutating_docs, offload.record(policies, version))


def print_table(rows: tuple[offload.RuleCoverage, ...], out: IO[str]) -> None:
    """Every rule: compiled, partly (which part stays, and why), left to the webhook (why), or off."""
    width = max((len(f"{r.policy}/{r.rule}") for r in rows), default=10)
    print(f"{'rule':<{width}}  {'mode':<7}  where it runs", file=out)
    for row in rows:
        label = f"{row.policy}/{row.rule}"
        if row.status == "off":
            print(f"{label:<{width}}  {row.mode:<7}  off: runs nowhere", file=out)
            continue
        status = {"compiled": "compiled fully", "partly": "compiled partly", "webhook": "left to the webhook"}[row.status]
        print(f"{label:<{width}}  {row.mode:<7}  {status}", file=out)
        if row.status == "partly":
            for what in row.compiled_parts():
                print(f"{'':<{width}}           in-process: {what}", file=out)
        for part in row.left_parts():
            print(f"{'':<{width}}           webhook: {part.what} ({part.why})", file=out)
    done, total = offload.share(rows)
    percent = 100 * done / total if total else 0.0
    print(f"coverage: {done} of {total} rule checks run in-process ({percent:.0f}%)", file=out)
